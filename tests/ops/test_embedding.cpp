// The token (and position) embedding of the CPU backend (src/backends/cpu/embedding.cpp):
// against PyTorch goldens (tools/reference/golden/transformer.py; bf16: tools/reference/golden/bf16_ops.py),
// finite differences, out-of-range ids, determinism and bad arguments.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "ops/op_test.h"
#include "remat/backend.h"
#include "remat/ops.h"
#include "support/expect_error.h"
#include "support/golden.h"
#include "support/gradcheck.h"

namespace remat::test {
namespace {

// Tolerances against the float64 references of tools/reference/golden/transformer.py: y exact (one
// float add is correctly rounded); dtable, dpos_table: rtol 1e-6, atol 1e-6.

TEST(Embedding, GoldenCasesExist) {
  // Guards the loops of MatchesPyTorch against passing vacuously when files are missing.
  EXPECT_GE(transformer_cases("embedding").size(), 2u);
}

TEST(Embedding, MatchesPyTorch) {
  for (const auto& name : transformer_cases("embedding")) {
    SCOPED_TRACE(name);
    const auto f = test::load_golden(name);
    const bool with_pos = test::meta_int(f, "pos") != 0;
    const Tensor ids = f.tensor("ids"), table = f.tensor("table"), dy = f.tensor("dy");
    const Tensor pos = with_pos ? f.tensor("pos_table") : Tensor();
    const Tensor y = ops::embedding(cpu(), ids, table, pos);
    EXPECT_ALL_CLOSE(y, f.tensor("y"), 0.0, 0.0);

    const Tensor t0 = random_tensor(table.shape(), 21);
    const Tensor dtable = t0.clone();
    Tensor p0, dpos;
    if (with_pos) {
      p0 = random_tensor(pos.shape(), 22);
      dpos = p0.clone();
    }
    ops::embedding_backward(cpu(), dy, ids, dtable, dpos);
    EXPECT_ALL_CLOSE(dtable, plus(t0, f.tensor("dtable")), 1e-6, 1e-6);
    if (with_pos) {
      EXPECT_ALL_CLOSE(dpos, plus(p0, f.tensor("dpos_table")), 1e-6, 1e-6);
      // Rows of pos_table past T receive nothing.
      const int64_t t = ids.size(1), c = pos.size(1);
      const auto got = dpos.to_vector(), init = p0.to_vector();
      for (int64_t i = t * c; i < pos.numel(); ++i) ASSERT_EQ(got[i], init[i]) << "flat index " << i;
    }
  }
}

TEST(Embedding, GradientsMatchFiniteDifferences) {
  const Tensor ids = random_ids(Shape{3, 5}, 4, 31);  // 15 tokens over 4 ids: many repeats
  const Tensor table = random_tensor(Shape{4, 18}, 32), pos = random_tensor(Shape{7, 18}, 33);
  const Tensor dy = random_tensor(Shape{3, 5, 18}, 34);
  const Tensor dtable = Tensor::zeros(table.shape()), dpos = Tensor::zeros(pos.shape());
  ops::embedding_backward(cpu(), dy, ids, dtable, dpos);
  auto loss = [&] { return dot(dy, ops::embedding(cpu(), ids, table, pos)); };
  test::GradCheckOptions opt;
  opt.max_elements = 1000;  // every element (the op is linear, so this is cheap and exact)
  EXPECT_TRUE(check_gradient("embedding dtable", table, dtable, loss, opt));
  EXPECT_TRUE(check_gradient("embedding dpos_table", pos, dpos, loss, opt));

  // Without positions, and with only the position gradient requested.
  const Tensor dtable2 = Tensor::zeros(table.shape());
  ops::embedding_backward(cpu(), dy, ids, dtable2, Tensor());
  EXPECT_TRUE(bitwise_equal(dtable2, dtable));
  const Tensor dpos2 = Tensor::zeros(pos.shape());
  ops::embedding_backward(cpu(), dy, ids, Tensor(), dpos2);
  EXPECT_TRUE(bitwise_equal(dpos2, dpos));
}

TEST(Embedding, OutOfRangeIdsAreErrors) {
  const Tensor table = random_tensor(Shape{5, 4}, 41);
  const Tensor y = Tensor::empty(Shape{2, 3, 4});
  EXPECT_REMAT_ERROR(cpu().embedding_forward(Tensor::from_ints({0, 1, 2, 3, 4, 5}, Shape{2, 3}), table, Tensor(), y),
                     "embedding_forward: ids[1, 2] = 5 is out of range [0, 5)");
  EXPECT_REMAT_ERROR(ops::embedding(cpu(), Tensor::from_ints({0, -1, 2, 3, 4, 0}, Shape{2, 3}), table, Tensor()),
                     "ids[0, 1] = -1 is out of range [0, 5)");
  // Backward checks the ids against dtable before touching it.
  const Tensor dtable = Tensor::zeros(Shape{5, 4});
  EXPECT_REMAT_ERROR(ops::embedding_backward(cpu(), random_tensor(Shape{2, 3, 4}, 42),
                                             Tensor::from_ints({0, 1, 7, 3, 4, 0}, Shape{2, 3}), dtable, Tensor()),
                     "embedding_backward: ids[0, 2] = 7 is out of range [0, 5)");
  for (float v : dtable.to_vector()) ASSERT_EQ(v, 0.0f);
}

// Every op of the family, forward and backward, on shapes large enough that the CPU loops run
// in parallel; returns all results.
std::vector<Tensor> run_embedding() {
  Backend& be = cpu();
  std::vector<Tensor> out;
  {
    const Tensor ids = random_ids(Shape{4, 64}, 10, 91), table = random_tensor(Shape{10, 72}, 92),
                 pos = random_tensor(Shape{80, 72}, 93), dy = random_tensor(Shape{4, 64, 72}, 94);
    const Tensor dtable = random_tensor(Shape{10, 72}, 95), dpos = random_tensor(Shape{80, 72}, 96);
    out.push_back(ops::embedding(be, ids, table, pos));
    ops::embedding_backward(be, dy, ids, dtable, dpos);
    out.insert(out.end(), {dtable, dpos});
  }
  return out;
}

TEST(Embedding, BitwiseAcrossRunsAndThreadCounts) { expect_bitwise_across_runs_and_thread_counts(run_embedding); }

TEST(Embedding, BadArgumentsNameTheOpAndShapes) {
  Backend& be = cpu();
  // Embedding: float ids, wrong ranks.
  const Tensor table = random_tensor(Shape{5, 4}, 125);
  EXPECT_REMAT_ERROR(
      be.embedding_forward(random_tensor(Shape{2, 3}, 126), table, Tensor(), Tensor::empty(Shape{2, 3, 4})),
      "embedding_forward: ids f32[2, 3] on cpu: expected dtype i32");
  EXPECT_REMAT_ERROR(
      be.embedding_forward(Tensor::from_ints({0, 1, 2}, Shape{3}), table, Tensor(), Tensor::empty(Shape{1, 3, 4})),
      "embedding_forward: ids i32[3] on cpu: expected rank 2");
  EXPECT_REMAT_ERROR(
      ops::embedding(be, Tensor::from_ints({0, 1, 2, 3}, Shape{2, 2}), table, random_tensor(Shape{1, 4}, 127)),
      "pos_table f32[1, 4] on cpu must be [Tmax >= 2, 4]");
}

// ---- bf16 ----------------------------------------------------------------------------------

TEST(Embedding, Bf16MatchesPyTorch) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  auto f = load_golden("bf16_ops/embedding");
  const Tensor& ids = f.tensor("ids");
  Tensor table = bf16_in(f, "table"), pos = bf16_in(f, "pos");
  Tensor y = bf16_empty(f.tensor("y").shape());
  cpu().embedding_forward(ids, table, pos, y);
  expect_bf16_golden(f, "y", y, 0, 0);
  Tensor dt = Tensor::zeros(table.shape()), dp = Tensor::zeros(pos.shape());
  ops::embedding_backward(cpu(), bf16_in(f, "dy"), ids, dt, dp);
  expect_bf16_golden(f, "dtable", dt, 0.01, 8);  // PyTorch adds a repeated id's rows in bf16; remat in fp32
  expect_bf16_golden(f, "dpos", dp, 0.01, 1);
}

TEST(Embedding, Bf16IsTheRoundedFp32Op) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  const int64_t B = 3, T = 9, V = 20, C = 40;
  std::vector<int32_t> id(static_cast<size_t>(B * T));
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<int32_t>((i * 5) % V);
  Tensor ids = Tensor::from_ints(id, Shape{B, T});
  Bf16Pair table = random_pair(Shape{V, C}, 8), pos = random_pair(Shape{T, C}, 9), y = empty_pair(Shape{B, T, C});
  cpu().embedding_forward(ids, table.f, pos.f, y.f);
  cpu().embedding_forward(ids, table.h, pos.h, y.h);
  expect_rounded(y, "embedding_forward");
  Bf16Pair dy = random_pair(Shape{B, T, C}, 10);
  Tensor dtf = Tensor::zeros(Shape{V, C}), dth = Tensor::zeros(Shape{V, C}), dpf = Tensor::zeros(Shape{T, C}),
         dph = Tensor::zeros(Shape{T, C});
  ops::embedding_backward(cpu(), dy.f, ids, dtf, dpf);
  ops::embedding_backward(cpu(), dy.h, ids, dth, dph);
  EXPECT_EQ(dtf.to_vector(), dth.to_vector());
  EXPECT_EQ(dpf.to_vector(), dph.to_vector());
}

}  // namespace
}  // namespace remat::test
