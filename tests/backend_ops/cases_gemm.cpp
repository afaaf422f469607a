// GEMM and linear layers (cuBLAS on cuda; OpenBLAS behind the emulator's cuBLAS on
// cuda-emu). Tolerances: fp32 sums of up to 300 products of values in [-1, 1].
#include <cstring>
#include <utility>
#include <vector>

#include "backend_ops/harness.h"

namespace remat::test {

REMAT_OP_CASE(gemm, plain_odd) {
  auto a = t.uniform({37, 53}), b = t.uniform({53, 29});
  auto c = t.output({37, 29});
  t.run([&](Backend& be, Side s) { be.gemm(s(a), s(b), s(c), {}); });
  t.expect_close(c, 1e-5, 1e-5, "c");
}

REMAT_OP_CASE(gemm, transposed_alpha_beta) {
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      auto a = ta ? t.uniform({19, 7}) : t.uniform({7, 19});
      auto b = tb ? t.uniform({11, 19}) : t.uniform({19, 11});
      auto c = t.output_like(t.uniform({7, 11}));
      GemmParams p{ta != 0, tb != 0, 0.5f, 2.0f};
      t.run([&](Backend& be, Side s) { be.gemm(s(a), s(b), s(c), p); });
      t.expect_close(c, 1e-5, 1e-5, "c ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
    }
  }
}

REMAT_OP_CASE(gemm, batched_and_shared_b) {
  auto a = t.uniform({3, 4, 5, 6}), b = t.uniform({3, 4, 6, 7}), b2 = t.uniform({6, 7});
  auto c = t.output({3, 4, 5, 7}), c2 = t.output({3, 4, 5, 7});
  t.run([&](Backend& be, Side s) {
    be.gemm(s(a), s(b), s(c), {});
    be.gemm(s(a), s(b2), s(c2), {});
  });
  t.expect_close(c, 1e-5, 1e-5, "c");
  t.expect_close(c2, 1e-5, 1e-5, "c (shared b)");
}

REMAT_OP_CASE(gemm, linear_forward_backward) {
  auto x = t.uniform({2, 5, 33}), w = t.uniform({17, 33}), b = t.uniform({17});
  auto y = t.output({2, 5, 17}), y_nb = t.output({2, 5, 17});
  t.run([&](Backend& be, Side s) {
    be.linear_forward(s(x), s(w), s(b), s(y));
    be.linear_forward(s(x), s(w), Tensor(), s(y_nb));
  });
  t.expect_close(y, 1e-5, 1e-5, "y");
  t.expect_close(y_nb, 1e-5, 1e-5, "y (no bias)");

  auto dy = t.uniform({2, 5, 17});
  auto dx = t.output({2, 5, 33});
  auto dw = t.output_like(t.uniform({17, 33}));  // accumulated into
  auto db = t.output_like(t.uniform({17}));
  t.run([&](Backend& be, Side s) { be.linear_backward(s(dy), s(x), s(w), s(dx), s(dw), s(db)); });
  t.expect_close(dx, 1e-5, 1e-5, "dx");
  t.expect_close(dw, 1e-5, 1e-5, "dw");
  t.expect_close(db, 1e-5, 1e-5, "db");
}

REMAT_OP_CASE(gemm, bias_grad_many_rows) {
  // column sums over 3000 rows: the reduction order differs from the CPU's
  auto x = t.uniform({3000, 45}), w = t.uniform({45, 45});
  auto dy = t.uniform({3000, 45});
  auto db = t.output_like(t.uniform({45}));
  t.run([&](Backend& be, Side s) { be.linear_backward(s(dy), s(x), s(w), Tensor(), Tensor(), s(db)); });
  t.expect_close(db, 1e-4, 1e-5, "db");
}

REMAT_OP_CASE(gemm, bias_grad_row_split_shapes) {
  // The CUDA column sums split the rows into chunks as the 64 KiB of scratch allows:
  // 3000 x 45 takes 188 chunks of 16 rows; 400 x 5000 only 3 (the scratch holds three rows
  // of chunk sums); 40 x 17000 none (wider than the scratch); 7 x 45 one short chunk.
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{400, 5000}, {40, 17000}, {7, 45}}) {
    auto x = t.uniform({rows, 3}), w = t.uniform({cols, 3});
    auto dy = t.uniform({rows, cols});
    auto init = t.uniform({cols});
    auto db = t.output_like(init), again = t.output_like(init);  // accumulated into
    t.run([&](Backend& be, Side s) {
      be.linear_backward(s(dy), s(x), s(w), Tensor(), Tensor(), s(db));
      be.linear_backward(s(dy), s(x), s(w), Tensor(), Tensor(), s(again));
    });
    const std::string what = "db " + std::to_string(rows) + " x " + std::to_string(cols);
    t.expect_close(db, 1e-4, 1e-5, what);
    // a fixed order: the same bits on a second run
    const std::vector<float> a = db.dut.to_vector(), b = again.dut.to_vector();
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << what;
  }
}

REMAT_OP_CASE(gemm, empty) {
  auto a = t.uniform({0, 5}), b = t.uniform({5, 4});
  auto c = t.output({0, 4});
  t.run([&](Backend& be, Side s) { be.gemm(s(a), s(b), s(c), {}); });
  t.expect_close(c, 0, 0, "c");
}

}  // namespace remat::test
