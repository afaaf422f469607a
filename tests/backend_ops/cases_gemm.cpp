// GEMM and linear layers (cuBLAS on cuda; OpenBLAS behind the emulator's cuBLAS on
// cuda-emu). Tolerances: fp32 sums of up to 300 products of values in [-1, 1].
#include <cstring>
#include <string>
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

// ---- bf16 (training.precision bf16; the two references: backend_ops/harness.h) ----------------
// GEMM and linear: cublasGemmEx with bf16 factors, fp32 accumulation ------------------
// Tolerances: the fp32 sums of the same (bf16) values in another order (cuBLAS's on the
// device, 512-wide panels on the CPU: up to ~1e-5 absolute at these sizes), then a bf16
// output may round to the neighbouring value: 1e-4 absolute + one bf16 step relative.
// f32 outputs of bf16 factors (parameter gradients) are fp32 sums: the fp32 cases' 1e-5.

REMAT_OP_CASE(gemm, bf16_gemm) {
  ActivationDTypeScope bf16(DType::bf16);
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      auto a = ta ? t.uniform_bf16({530, 37}) : t.uniform_bf16({37, 530});
      auto b = tb ? t.uniform_bf16({29, 530}) : t.uniform_bf16({530, 29});
      auto c = t.output({37, 29}, DType::bf16);
      auto c_beta = t.output_like(t.uniform_bf16({37, 29}));
      auto c_f32 = t.output_like(t.uniform({37, 29}));
      GemmParams p{ta != 0, tb != 0, 1.0f, 0.0f}, q{ta != 0, tb != 0, 0.5f, 2.0f};
      t.run([&](Backend& be, Side s) {
        be.gemm(s(a), s(b), s(c), p);
        be.gemm(s(a), s(b), s(c_beta), q);
        be.gemm(s(a), s(b), s(c_f32), q);
      });
      const std::string what = " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb);
      t.expect_close(c, 1e-4, kBf16Rel, "c" + what);
      t.expect_close(c_beta, 1e-4, kBf16Rel, "c (alpha, beta)" + what);
      t.expect_close(c_f32, 1e-5, 1e-5, "c f32 (alpha, beta)" + what);
    }
  }
  auto a = t.uniform_bf16({3, 4, 5, 6}), b = t.uniform_bf16({3, 4, 6, 7}), b2 = t.uniform_bf16({6, 7});
  auto c = t.output({3, 4, 5, 7}, DType::bf16), c2 = t.output({3, 4, 5, 7}, DType::bf16);
  t.run([&](Backend& be, Side s) {
    be.gemm(s(a), s(b), s(c), {});
    be.gemm(s(a), s(b2), s(c2), {});
  });
  t.expect_close(c, 1e-4, kBf16Rel, "c batched");
  t.expect_close(c2, 1e-4, kBf16Rel, "c batched (shared b)");
}

REMAT_OP_CASE(gemm, bf16_linear) {
  ActivationDTypeScope bf16(DType::bf16);
  // k = 1100 spans three of the CPU's 512-wide panels, 600 outputs two tiles.
  auto x = t.uniform_bf16({2, 35, 1100}), w = t.uniform_bf16({600, 1100}), b = t.uniform_bf16({600});
  auto b_f32 = t.uniform({600});  // an f32 bias into a bf16 y: broadcast rounded, then the GEMM
  auto y = t.output({2, 35, 600}, DType::bf16), y_nb = t.output({2, 35, 600}, DType::bf16);
  auto y_fb = t.output({2, 35, 600}, DType::bf16), y_f32 = t.output({2, 35, 600});
  t.run([&](Backend& be, Side s) {
    be.linear_forward(s(x), s(w), s(b), s(y));
    be.linear_forward(s(x), s(w), Tensor(), s(y_nb));
    be.linear_forward(s(x), s(w), s(b_f32), s(y_fb));
    be.linear_forward(s(x), s(w), s(b), s(y_f32));
  });
  t.expect_close(y, 1e-4, kBf16Rel, "y");
  t.expect_close(y_nb, 1e-4, kBf16Rel, "y (no bias)");
  // On the device an f32 bias is rounded to bf16 first (|b| < 1: off by up to 2^-9).
  t.expect_close(y_fb, 1e-4 + 1.0 / 512, kBf16Rel, "y (f32 bias)");
  t.expect_close(y_f32, 1e-4, 1e-5, "y f32 from bf16 factors");

  auto dy = t.uniform_bf16({2, 35, 600});
  auto dx = t.output({2, 35, 1100}, DType::bf16);
  auto dw = t.output_like(t.uniform({600, 1100}));  // f32 parameter gradients, accumulated into
  auto db = t.output_like(t.uniform({600}));
  t.run([&](Backend& be, Side s) { be.linear_backward(s(dy), s(x), s(w), s(dx), s(dw), s(db)); });
  t.expect_close(dx, 1e-4, kBf16Rel, "dx");
  t.expect_close(dw, 1e-5, 1e-5, "dw (f32)");
  t.expect_close(db, 1e-5, 1e-5, "db (f32)");
  // Column sums over many rows, split into chunks on the device.
  auto dy_many = t.uniform_bf16({3000, 45}), x_many = t.uniform_bf16({3000, 45}), w_many = t.uniform_bf16({45, 45});
  auto db_many = t.output_like(t.uniform({45}));
  t.run([&](Backend& be, Side s) {
    be.linear_backward(s(dy_many), s(x_many), s(w_many), Tensor(), Tensor(), s(db_many));
  });
  t.expect_close(db_many, 1e-4, 1e-5, "db over 3000 rows");
}

// cuBLAS has no f32-by-bf16 product (nor f32 factors into a bf16 C): the device runs its own
// FMA GEMM (kernels/gemm.cuh) for them, as a linear reading the f32 batch with bf16 working
// weights needs (mlp_deep's first layer). Against the CPU (which stages fp32): the
// tolerances above; the same bits on a second run.
REMAT_OP_CASE(gemm, bf16_mixed_factors) {
  ActivationDTypeScope bf16(DType::bf16);
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      auto a = ta ? t.uniform({70, 37}) : t.uniform({37, 70});  // f32 (not bf16 values)
      auto b = tb ? t.uniform_bf16({29, 70}) : t.uniform_bf16({70, 29});
      auto a16 = ta ? t.uniform_bf16({70, 37}) : t.uniform_bf16({37, 70});
      auto b32 = tb ? t.uniform({29, 70}) : t.uniform({70, 29});
      auto c = t.output({37, 29}, DType::bf16), c_again = t.output({37, 29}, DType::bf16);
      auto c_f32 = t.output_like(t.uniform({37, 29})), c_other = t.output_like(t.uniform_bf16({37, 29}));
      auto c_both32 = t.output({37, 29}, DType::bf16);  // f32 factors into a bf16 C
      auto a32 = ta ? t.uniform({70, 37}) : t.uniform({37, 70});
      GemmParams p{ta != 0, tb != 0, 1.0f, 0.0f}, q{ta != 0, tb != 0, 0.5f, 2.0f};
      t.run([&](Backend& be, Side s) {
        be.gemm(s(a), s(b), s(c), p);
        be.gemm(s(a), s(b), s(c_again), p);
        be.gemm(s(a), s(b), s(c_f32), q);
        be.gemm(s(a16), s(b32), s(c_other), q);
        be.gemm(s(a32), s(b32), s(c_both32), p);
      });
      const std::string what = " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb);
      t.expect_close(c, 1e-4, kBf16Rel, "f32 by bf16 into bf16" + what);
      t.expect_close(c_f32, 1e-5, 1e-5, "f32 by bf16 into f32 (alpha, beta)" + what);
      t.expect_close(c_other, 1e-4, kBf16Rel, "bf16 by f32 into bf16 (alpha, beta)" + what);
      t.expect_close(c_both32, 1e-4, kBf16Rel, "f32 by f32 into bf16" + what);
      if (!perf_iterations()) {
        EXPECT_EQ(dut_bits(c.dut), dut_bits(c_again.dut)) << "a second run" << what;
      }
    }
  }
  // Batched, and a batch sharing b.
  auto a = t.uniform({3, 4, 5, 6}), b = t.uniform_bf16({3, 4, 6, 7}), b2 = t.uniform_bf16({6, 7});
  auto c = t.output({3, 4, 5, 7}, DType::bf16), c2 = t.output({3, 4, 5, 7}, DType::bf16);
  t.run([&](Backend& be, Side s) {
    be.gemm(s(a), s(b), s(c), {});
    be.gemm(s(a), s(b2), s(c2), {});
  });
  t.expect_close(c, 1e-4, kBf16Rel, "f32 by bf16 batched");
  t.expect_close(c2, 1e-4, kBf16Rel, "f32 by bf16 batched (shared b)");
  // A linear on the f32 batch with bf16 weights: forward, and backward (dw, db; dx too).
  auto x = t.uniform({2, 9, 150}), w = t.uniform_bf16({40, 150}), bias = t.uniform_bf16({40});
  auto y = t.output({2, 9, 40}, DType::bf16);
  t.run([&](Backend& be, Side s) { be.linear_forward(s(x), s(w), s(bias), s(y)); });
  t.expect_close(y, 1e-4, kBf16Rel, "linear y from an f32 x");
  auto dy = t.uniform_bf16({2, 9, 40});
  auto dx = t.output({2, 9, 150}), dw = t.output_like(t.uniform({40, 150})), db = t.output_like(t.uniform({40}));
  t.run([&](Backend& be, Side s) { be.linear_backward(s(dy), s(x), s(w), s(dx), s(dw), s(db)); });
  t.expect_close(dx, 1e-5, 1e-5, "linear dx (f32) from an f32 x");
  t.expect_close(dw, 1e-5, 1e-5, "linear dw (f32) from an f32 x");
  t.expect_close(db, 1e-5, 1e-5, "linear db (f32)");
}

// ---- Gradients: the device's backward against central differences of its own forward --------
// (backend_ops/harness.h, "Gradient cases")

REMAT_OP_CASE(gemm, grad_linear) {
  const int64_t rows = 6, in = 9, out = 7;
  auto x = t.uniform({rows, in}), w = t.uniform({out, in}), b = t.uniform({out}), dy = t.uniform({rows, out});
  auto dx = t.output({rows, in}), dw = t.output_like(t.values(std::vector<float>(out * in, 0.0f), {out, in}));
  auto db = t.output_like(t.values(std::vector<float>(out, 0.0f), {out}));
  t.run([&](Backend& be, Side d) { be.linear_backward(d(dy), d(x), d(w), d(dx), d(dw), d(db)); });
  auto y = t.output({rows, out});
  auto loss = [&](Backend& be) {
    be.linear_forward(x.dut, w.dut, b.dut, y.dut);
    return dot(dy.dut, y.dut);
  };
  t.expect_gradient("linear dx", x, dx, loss);
  t.expect_gradient("linear dw", w, dw, loss);
  t.expect_gradient("linear db", b, db, loss);
}

}  // namespace remat::test
