// Token (+ position) embedding. Tolerance 0 throughout: the forward is a gather plus one
// addition, and the backward adds the same rows in the same order as the CPU backend
// (a deterministic scatter, no atomics), so every result is bit-identical.
#include <cstdint>
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

REMAT_OP_CASE(embedding, backward_repeated_ids) {
  // Few distinct ids over many positions: rows of dtable get many contributions, spread
  // over several 128-position scan steps (n = 200); C = 300 spans two channel chunks, the
  // last partial.
  const EmbShape shapes[] = {
      {2, 33, 4, 300, 40}, {2, 16, 7, 33, 16}, {2, 5, 50, 8, 9}, {1, 1, 3, 1, 1}, {2, 100, 5, 40, 100}};
  for (const auto& s : shapes) {
    auto ids = t.ints({s.b, s.t}, 0, static_cast<int>(s.v - 1));
    auto dy = t.uniform({s.b, s.t, s.c});
    auto dtable = t.output_like(t.uniform({s.v, s.c}));  // accumulated into
    auto dpos = t.output_like(t.uniform({s.tmax, s.c}));
    t.run([&](Backend& be, Side sd) { ops::embedding_backward(be, sd(dy), sd(ids), sd(dtable), sd(dpos)); });
    t.expect_equal(dtable, "dtable " + label(s));
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
    t.expect_equal(dtable, v == &same ? "dtable (one id)" : "dtable (late first occurrences)");
  }
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

}  // namespace remat::test
