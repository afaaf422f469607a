// Token (+ position) embedding. The forward is a gather plus one addition and the
// position gradient adds the batch in order: bit-identical to the CPU backend. The table
// gradient adds an id's rows in position order when the id has at most 32 positions (one
// segment on the device, kernels/embedding.cuh): bit-identical too; a more frequent id's
// rows are summed by segments of 32 whose sums are then added in order, so its row of
// dtable differs from the CPU's by rounding: |dut - ref| <= kSegAtol + kSegRtol |ref|
// (sums of up to ~1000 terms in [-1, 1] plus a start value: partial sums below ~40, whose
// ulp is 4e-6; two orders differ by a few hundred roundings at most, far fewer in practice).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backend_ops/harness.h"
#include "remat/error.h"
#include "remat/ops.h"

namespace remat::test {

namespace {

struct EmbShape {
  int64_t b, t, v, c, tmax;  // tmax = 0: no pos_table
};

std::string label(const EmbShape& s) {
  return "B=" + std::to_string(s.b) + " T=" + std::to_string(s.t) + " V=" + std::to_string(s.v) +
         " C=" + std::to_string(s.c) + (s.tmax ? " Tmax=" + std::to_string(s.tmax) : " no pos");
}

}  // namespace

REMAT_OP_CASE(embedding, forward) {
  const EmbShape shapes[] = {{2, 5, 11, 8, 5}, {2, 16, 7, 33, 20}, {2, 33, 50, 64, 40},
                             {1, 1, 3, 1, 0},  {2, 33, 9, 20, 0},  {3, 7, 1, 300, 7}};
  for (const auto& s : shapes) {
    auto ids = t.ints({s.b, s.t}, 0, static_cast<int>(s.v - 1));
    auto table = t.uniform({s.v, s.c});
    auto pos = s.tmax ? t.uniform({s.tmax, s.c}) : Pair{};
    auto y = t.output({s.b, s.t, s.c});  // guarded: not 16-byte aligned, the scalar path
    t.run([&](Backend& be, Side sd) { be.embedding_forward(sd(ids), sd(table), sd(pos), sd(y)); });
    t.expect_equal(y, "y " + label(s));
  }
}

REMAT_OP_CASE(embedding, forward_aligned) {
  // Outputs straight from the allocator (16-byte aligned) take the float4 path when C % 4 == 0.
  for (int64_t c : {8, 64, 36}) {
    auto ids = t.ints({2, 17}, 0, 12);
    auto table = t.uniform({13, c}), pos = t.uniform({17, c});
    auto y = t.uniform({2, 17, c}), y_nopos = t.uniform({2, 17, c});
    ASSERT_EQ(reinterpret_cast<uintptr_t>(y.dut.f32()) % 16, 0u);
    t.run([&](Backend& be, Side s) {
      be.embedding_forward(s(ids), s(table), s(pos), s(y));
      be.embedding_forward(s(ids), s(table), Tensor(), s(y_nopos));
    });
    t.expect_equal(y, "y C=" + std::to_string(c));
    t.expect_equal(y_nopos, "y (no pos) C=" + std::to_string(c));
  }
}

namespace {

constexpr int64_t kSeg = 32;  // kernels/embedding.cuh's kEmbeddingSegment
constexpr double kSegAtol = 2e-4, kSegRtol = 1e-5;

// dtable against the reference: bitwise in the rows of ids with at most kSeg positions (and
// the rows no id touches), within kSegAtol + kSegRtol |ref| in the others.
void expect_dtable(const Pair& dtable, const std::vector<int32_t>& ids, const std::string& what) {
  std::map<int32_t, int64_t> count;
  for (int32_t id : ids) ++count[id];
  const int64_t c = dtable.ref.size(1);
  const auto ref = dtable.ref.to_vector(), dut = dtable.dut.to_vector();
  int64_t bad = 0;
  for (int64_t r = 0; r < dtable.ref.size(0); ++r) {
    const auto it = count.find(static_cast<int32_t>(r));
    const bool exact = it == count.end() || it->second <= kSeg;
    for (int64_t j = 0; j < c; ++j) {
      const float a = ref[r * c + j], b = dut[r * c + j];
      const bool ok = exact ? std::memcmp(&a, &b, sizeof a) == 0
                            : std::fabs(static_cast<double>(b) - a) <= kSegAtol + kSegRtol * std::fabs(a);
      if (!ok && bad++ < 5)
        ADD_FAILURE() << what << ": dtable[" << r << ", " << j << "] = " << b << ", the cpu's " << a << " ("
                      << (exact ? "compared bitwise" : "compared within tolerance") << ", id with "
                      << (it == count.end() ? 0 : it->second) << " positions)";
    }
  }
  EXPECT_EQ(bad, 0) << what << ": elements out of tolerance";
}

std::vector<int32_t> host_ids(const Pair& ids) {
  std::vector<int32_t> v(static_cast<size_t>(ids.ref.numel()));
  std::copy_n(ids.ref.i32(), v.size(), v.begin());
  return v;
}

}  // namespace

REMAT_OP_CASE(embedding, backward_repeated_ids) {
  // Few distinct ids over many positions: rows of dtable get many contributions, spread
  // over several 128-position scan steps (n = 200, ids with more than one segment); C = 300
  // spans two channel chunks, the last partial.
  const EmbShape shapes[] = {
      {2, 33, 4, 300, 40}, {2, 16, 7, 33, 16}, {2, 5, 50, 8, 9}, {1, 1, 3, 1, 1}, {2, 100, 5, 40, 100}};
  for (const auto& s : shapes) {
    auto ids = t.ints({s.b, s.t}, 0, static_cast<int>(s.v - 1));
    auto dy = t.uniform({s.b, s.t, s.c});
    auto dtable = t.output_like(t.uniform({s.v, s.c}));  // accumulated into
    auto dpos = t.output_like(t.uniform({s.tmax, s.c}));
    t.run([&](Backend& be, Side sd) { ops::embedding_backward(be, sd(dy), sd(ids), sd(dtable), sd(dpos)); });
    expect_dtable(dtable, host_ids(ids), "dtable " + label(s));
    t.expect_equal(dpos, "dpos_table " + label(s));
  }
}

REMAT_OP_CASE(embedding, backward_one_id_and_late_first) {
  // Every position holds id 2; then ids 3 and 4 first at positions 260 and 261 of 300
  // (past two 128-position scan steps).
  std::vector<int32_t> same(2 * 150, 2), late(2 * 150, 0);
  for (size_t i = 0; i < late.size(); ++i) late[i] = static_cast<int32_t>(i < 260 ? i % 3 : 3 + i % 2);
  for (const auto* v : {&same, &late}) {
    auto ids = t.int_values(*v, {2, 150});
    auto dy = t.uniform({2, 150, 40});
    auto dtable = t.output_like(t.uniform({6, 40}));
    t.run([&](Backend& be, Side s) { ops::embedding_backward(be, s(dy), s(ids), s(dtable), Tensor()); });
    expect_dtable(dtable, *v, v == &same ? "dtable (one id)" : "dtable (late first occurrences)");
  }
}

namespace {

// Skewed ids over n positions (shuffled by rng): id 0 at 60% of them (many segments), ids
// 1-4 exactly kSeg, kSeg + 1, 2 kSeg and 2 kSeg + 1 times (one segment, one and a position,
// two, two and a position), every other id once (5, 6, ...).
std::vector<int32_t> skewed_ids(int64_t n, std::mt19937_64& rng) {
  std::vector<int32_t> v;
  const int64_t exact[] = {kSeg, kSeg + 1, 2 * kSeg, 2 * kSeg + 1};
  for (int k = 0; k < 4; ++k) v.insert(v.end(), static_cast<size_t>(exact[k]), k + 1);
  const auto frequent = static_cast<size_t>(n * 6 / 10);
  v.insert(v.end(), frequent, 0);
  for (int32_t id = 5; static_cast<int64_t>(v.size()) < n; ++id) v.push_back(id);
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

}  // namespace

REMAT_OP_CASE(embedding, backward_skewed_ids) {
  // n = 1200 positions (B = 4, T = 300): id 0 at 720 (23 segments), ids once, ids at 32, 33,
  // 64 and 65 positions; C = 300 (two channel chunks, the last partial) and 768 (GPT-2's
  // width, three chunks). fp32 and bf16 dy. Within tolerance of the cpu, bitwise where an id
  // has one segment, and bitwise run to run on the device.
  const int64_t b = 4, tt = 300, n = b * tt;
  const std::vector<int32_t> v = skewed_ids(n, t.rng());
  const int32_t vocab = *std::max_element(v.begin(), v.end()) + 3;  // rows no id touches
  auto ids = t.int_values(v, {b, tt});
  for (int64_t c : {300, 768})
    for (bool bf16 : {false, true}) {
      ActivationDTypeScope scope(bf16 ? DType::bf16 : DType::f32);
      const std::string what = "skewed ids C=" + std::to_string(c) + (bf16 ? " bf16 dy" : " f32 dy");
      auto dy = bf16 ? t.uniform_bf16({b, tt, c}) : t.uniform({b, tt, c});
      auto start = t.uniform({vocab, c});
      Pair dtable[2] = {t.output_like(start), t.output_like(start)};
      t.run([&](Backend& be, Side s) {
        for (const Pair& d : dtable) ops::embedding_backward(be, s(dy), s(ids), s(d), Tensor());
      });
      expect_dtable(dtable[0], v, what);
      t.expect_equal({dtable[0].dut, dtable[1].dut}, what + " run to run");
    }
}

REMAT_OP_CASE(embedding, backward_workspace) {
  // The device's workspace: (n - 1) / 32 slot sums of C floats, then n ranks and the slots'
  // positions (int32); the cpu needs none. It is required when dtable is defined.
  auto ids = t.ints({2, 40}, 0, 3);
  auto dy = t.uniform({2, 40, 24});
  auto dtable = t.output_like(t.uniform({4, 24}));
  t.run([&](Backend& be, Side s) {
    const size_t bytes = be.embedding_backward_workspace(Shape{2, 40, 24});
    EXPECT_EQ(bytes, s.ref ? 0u : (2u * 24 + 80 + 2) * 4) << be.name();
    EXPECT_EQ(be.embedding_backward_workspace(Shape{8, 1024, 768}), s.ref ? 0u : (255u * 768 + 8192 + 255) * 4);
    if (!s.ref) {
      EXPECT_THROW(be.embedding_backward(s(dy), s(ids), s(dtable), Tensor(), Tensor()), Error) << "no workspace";
    }
    be.embedding_backward(s(dy), s(ids), Tensor(), Tensor(), Tensor());  // nothing to size
  });
}

REMAT_OP_CASE(embedding, backward_pos_only_aligned) {
  // dpos_table alone, from aligned buffers (the float4 path), and with an odd width.
  for (int64_t c : {64, 13}) {
    auto ids = t.ints({3, 9}, 0, 4);
    auto dy = t.uniform({3, 9, c});
    auto dpos = t.uniform({12, c});  // unguarded: aligned; accumulated into
    auto dtable = t.output_like(t.uniform({5, c}));
    t.run([&](Backend& be, Side s) { ops::embedding_backward(be, s(dy), s(ids), Tensor(), s(dpos)); });
    t.expect_equal(dpos, "dpos_table C=" + std::to_string(c));
    t.run([&](Backend& be, Side s) { ops::embedding_backward(be, s(dy), s(ids), s(dtable), Tensor()); });
    t.expect_equal(dtable, "dtable C=" + std::to_string(c));
  }
}

REMAT_OP_CASE(embedding, out_of_range_ids) {
  // Both backends throw the same message (up to device names) and leave dtable untouched.
  for (int32_t bad : {7, -1}) {
    auto ids = t.int_values({0, 1, 2, 3, 4, 5, 6, bad, 1, bad}, {2, 5});
    auto table = t.uniform({7, 6});
    auto y = t.output({2, 5, 6});
    auto dy = t.uniform({2, 5, 6});
    auto dtable = t.output_like(t.uniform({7, 6}));
    std::string msg[2][2];
    t.run([&](Backend& be, Side s) {
      for (int op = 0; op < 2; ++op) {
        try {
          if (op == 0)
            be.embedding_forward(s(ids), s(table), Tensor(), s(y));
          else
            ops::embedding_backward(be, s(dy), s(ids), s(dtable), Tensor());
          ADD_FAILURE() << "no error on " << be.name();
        } catch (const Error& e) {
          // Without the source location at the end, and with the device named alike.
          std::string m = e.what();
          m = m.substr(0, m.rfind(" ("));
          const std::string dev = be.device().str();
          for (size_t at = m.find(dev); at != std::string::npos; at = m.find(dev)) m.replace(at, dev.size(), "DEV");
          msg[s.ref ? 0 : 1][op] = m;
        }
      }
    });
    const std::string want = "ids[1, 2] = " + std::to_string(bad) + " is out of range [0, 7)";
    for (int op = 0; op < 2; ++op) {
      EXPECT_NE(msg[0][op].find(want), std::string::npos) << msg[0][op];
      EXPECT_EQ(msg[0][op], msg[1][op]);
    }
    t.expect_equal(dtable, "dtable after the error (unchanged)");
  }
}

// ---- bf16 (training.precision bf16; the two references: backend_ops/harness.h) ----------------
// A gather (+ positions), gradients into f32 tables: bitwise the CPU

REMAT_OP_CASE(embedding, bf16) {
  ActivationDTypeScope bf16(DType::bf16);
  const int64_t B = 3, T = 9, V = 20;
  for (int64_t c : {40, 37, 256}) {  // units of eight bf16, one by one, several 256-channel chunks
    const std::string what = " C=" + std::to_string(c);
    auto ids = t.ints({B, T}, 0, static_cast<int>(V - 1));
    auto table = t.uniform_bf16({V, c}), pos = t.uniform_bf16({T, c});
    auto y = t.output({B, T, c}, DType::bf16), y_aligned = aligned_bf16_output(t, {B, T, c});
    auto y_nopos = t.output({B, T, c}, DType::bf16);
    auto table_f32 = t.uniform({V, c});  // an f32 table into a bf16 y (mixed)
    auto y_mixed = t.output({B, T, c}, DType::bf16);
    t.run([&](Backend& be, Side s) {
      be.embedding_forward(s(ids), s(table), s(pos), s(y));
      be.embedding_forward(s(ids), s(table), s(pos), s(y_aligned));
      be.embedding_forward(s(ids), s(table), Tensor(), s(y_nopos));
      be.embedding_forward(s(ids), s(table_f32), s(pos), s(y_mixed));
    });
    t.expect_equal(y, "embedding y" + what);
    t.expect_equal(y_aligned, "embedding y (aligned)" + what);
    t.expect_equal(y_nopos, "embedding y (no positions)" + what);
    t.expect_equal(y_mixed, "embedding y (f32 table)" + what);
    auto dy = t.uniform_bf16({B, T, c});
    auto dtable = t.output_like(t.uniform({V, c})), dpos = t.output_like(t.uniform({T, c}));
    t.run([&](Backend& be, Side s) { ops::embedding_backward(be, s(dy), s(ids), s(dtable), s(dpos)); });
    t.expect_equal(dtable, "embedding dtable (f32)" + what);
    t.expect_equal(dpos, "embedding dpos_table (f32)" + what);
  }
}

// ---- Gradients: the device's backward against central differences of its own forward --------
// (backend_ops/harness.h, "Gradient cases")

// y is linear in the tables.
REMAT_OP_CASE(embedding, grad) {
  auto ids = t.int_values({3, 0, 3, 1, 2, 3}, {2, 3});
  auto table = t.uniform({4, 5}), pos = t.uniform({3, 5}), dy = t.uniform({2, 3, 5});
  auto zeros = [&](const Shape& s) { return t.output_like(t.values(std::vector<float>(s.numel(), 0.0f), s)); };
  auto dtable = zeros({4, 5}), dpos = zeros({3, 5});
  t.run([&](Backend& be, Side d) { ops::embedding_backward(be, d(dy), d(ids), d(dtable), d(dpos)); });
  auto y = t.output({2, 3, 5});
  auto loss = [&](Backend& be) {
    be.embedding_forward(ids.dut, table.dut, pos.dut, y.dut);
    return dot(dy.dut, y.dut);
  };
  t.expect_gradient("embedding dtable", table, dtable, loss);
  t.expect_gradient("embedding dpos_table", pos, dpos, loss);
}

}  // namespace remat::test
