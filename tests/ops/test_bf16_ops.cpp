// The CPU backend's ops on bf16 tensors (training.precision bf16: bf16 storage, fp32
// compute, src/backends/cpu/mixed.h). Reference: the same op in fp32 on the bf16 inputs
// widened to float, its outputs rounded to bf16. Elementwise and row ops stage the very
// values the fp32 op reads, so they must give exactly those bits; the GEMMs sum k in
// 512-wide panels (another order than one sgemm), so they are compared within a bf16
// rounding step; attention rounds its probabilities to bf16 before P V (stated in
// attention.cpp), so its probabilities are bitwise and its outputs within tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/bf16.h"
#include "backends/cpu/conv_internal.h"
#include "remat/backend.h"
#include "remat/bf16.h"
#include "remat/dtype.h"
#include "remat/error.h"
#include "remat/ops.h"
#include "remat/tensor.h"

using namespace remat;

namespace {

Backend& cpu_be() { return backend_for(Device::cpu()); }

std::vector<float> random_bf16_values(int64_t n, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = round_to_bf16(u(g));
  return v;
}

// A pair: the same values as f32 and as bf16.
struct Pair {
  Tensor f, h;
};
Pair pair(const std::vector<float>& v, const Shape& s) {
  Pair p{Tensor::from_vector(v, s), Tensor::empty(s, Device::cpu(), DType::bf16)};
  cpu::f32_to_bf16(v.data(), p.h.bf16(), s.numel());
  return p;
}
Pair random_pair(const Shape& s, uint32_t seed) { return pair(random_bf16_values(s.numel(), seed), s); }
Pair empty_pair(const Shape& s) { return Pair{Tensor::empty(s), Tensor::empty(s, Device::cpu(), DType::bf16)}; }

std::vector<uint16_t> bits(const Tensor& t) {
  if (t.dtype() == DType::bf16) return std::vector<uint16_t>(t.bf16(), t.bf16() + t.numel());
  std::vector<uint16_t> out(static_cast<size_t>(t.numel()));
  cpu::f32_to_bf16(t.f32(), out.data(), t.numel());
  return out;
}
std::vector<float> widen(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  cpu::bf16_to_f32(t.bf16(), out.data(), t.numel());
  return out;
}

// The bf16 result is the rounded fp32 result, bit for bit.
void expect_rounded(const Pair& p, const char* what) {
  const auto a = bits(p.h), b = bits(p.f);
  ASSERT_EQ(a.size(), b.size());
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += a[i] != b[i];
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << a.size() << " elements differ from the rounded fp32 result";
}

// Within `rel` of the fp32 result, relative to the largest magnitude of the fp32 result.
void expect_close(const Pair& p, double rel, const char* what) {
  const auto h = widen(p.h);
  const auto f = p.f.to_vector();
  double mx = 0, worst = 0;
  for (float v : f) mx = std::max(mx, std::fabs(static_cast<double>(v)));
  for (size_t i = 0; i < f.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(h[i]) - f[i]));
  EXPECT_LE(worst, rel * std::max(mx, 1e-30)) << what << ": worst error " << worst << " against max |x| " << mx;
  EXPECT_GT(mx, 0.0) << what << ": the reference is all zero";
}

class Bf16Ops : public ::testing::Test {
 protected:
  ActivationDTypeScope scope_{DType::bf16};
};

TEST_F(Bf16Ops, ElementwiseAreTheRoundedFp32Ops) {
  const Shape s{3, 5000};  // several pieces and parallel chunks, a short last one
  Pair a = random_pair(s, 1), b = random_pair(s, 2);
  Pair y = empty_pair(s);
  cpu_be().add(a.f, b.f, y.f);
  cpu_be().add(a.h, b.h, y.h);
  expect_rounded(y, "add");
  cpu_be().gelu_forward(a.f, GeluApprox::tanh, y.f);
  cpu_be().gelu_forward(a.h, GeluApprox::tanh, y.h);
  expect_rounded(y, "gelu tanh");
  cpu_be().gelu_backward(b.f, a.f, GeluApprox::none, y.f);
  cpu_be().gelu_backward(b.h, a.h, GeluApprox::none, y.h);
  expect_rounded(y, "gelu_backward erf");
  cpu_be().dropout_forward(a.f, 0.25f, RngState{7, 123}, y.f);
  cpu_be().dropout_forward(a.h, 0.25f, RngState{7, 123}, y.h);
  expect_rounded(y, "dropout");
  // In place, as backward runs it (dx aliases dy).
  Pair g = random_pair(s, 3);
  cpu_be().dropout_backward(g.f, 0.25f, RngState{7, 123}, g.f);
  cpu_be().dropout_backward(g.h, 0.25f, RngState{7, 123}, g.h);
  expect_rounded(g, "dropout_backward in place");
  g = pair(widen(g.h), s);  // both sides from the same (bf16) values again
  cpu_be().accumulate(g.f, a.f);
  cpu_be().accumulate(g.h, a.h);
  expect_rounded(g, "accumulate");
}

TEST_F(Bf16Ops, RowOpsAreTheRoundedFp32Ops) {
  const int64_t n = 37, c = 96;
  Pair x = random_pair(Shape{n, c}, 4), gamma = random_pair(Shape{c}, 5), beta = random_pair(Shape{c}, 6);
  Pair y = empty_pair(Shape{n, c});
  Tensor mf = Tensor::empty(Shape{n}), rf = Tensor::empty(Shape{n}), mh = Tensor::empty(Shape{n}),
         rh = Tensor::empty(Shape{n});
  cpu_be().layernorm_forward(x.f, gamma.f, beta.f, 1e-5f, y.f, mf, rf);
  cpu_be().layernorm_forward(x.h, gamma.h, beta.h, 1e-5f, y.h, mh, rh);
  expect_rounded(y, "layernorm_forward");
  EXPECT_EQ(mf.to_vector(), mh.to_vector());
  EXPECT_EQ(rf.to_vector(), rh.to_vector());
  Pair dy = random_pair(Shape{n, c}, 7), dx = empty_pair(Shape{n, c});
  Tensor dgf = Tensor::zeros(Shape{c}), dbf = Tensor::zeros(Shape{c}), dgh = Tensor::zeros(Shape{c}),
         dbh = Tensor::zeros(Shape{c});
  ops::layernorm_backward(cpu_be(), dy.f, x.f, gamma.f, mf, rf, dx.f, dgf, dbf);
  ops::layernorm_backward(cpu_be(), dy.h, x.h, gamma.h, mh, rh, dx.h, dgh, dbh);
  expect_rounded(dx, "layernorm_backward dx");
  EXPECT_EQ(dgf.to_vector(), dgh.to_vector()) << "dgamma (f32) from bf16 inputs";
  EXPECT_EQ(dbf.to_vector(), dbh.to_vector()) << "dbeta (f32) from bf16 inputs";

  cpu_be().softmax_forward(x.f, false, y.f);
  cpu_be().softmax_forward(x.h, false, y.h);
  expect_rounded(y, "softmax");

  // Cross-entropy: the loss and lse are f32 and equal; dlogits rounded.
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7) % c);
  t[3] = -100;
  Tensor targets = Tensor::from_ints(t, Shape{n});
  Tensor lf = Tensor::empty(Shape{1}), lh = Tensor::empty(Shape{1}), sf = Tensor::empty(Shape{n}),
         sh = Tensor::empty(Shape{n});
  cpu_be().cross_entropy_forward(x.f, targets, -100, lf, sf);
  cpu_be().cross_entropy_forward(x.h, targets, -100, lh, sh);
  EXPECT_EQ(lf.to_vector(), lh.to_vector());
  EXPECT_EQ(sf.to_vector(), sh.to_vector());
  cpu_be().cross_entropy_backward(1.0f, x.f, targets, sf, -100, dx.f);
  cpu_be().cross_entropy_backward(1.0f, x.h, targets, sh, -100, dx.h);
  expect_rounded(dx, "cross_entropy_backward");
  EXPECT_EQ(cpu_be().accuracy(x.f, targets, -100, nullptr), cpu_be().accuracy(x.h, targets, -100, nullptr));
}

TEST_F(Bf16Ops, EmbeddingIsTheRoundedFp32Op) {
  const int64_t B = 3, T = 9, V = 20, C = 40;
  std::vector<int32_t> id(static_cast<size_t>(B * T));
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<int32_t>((i * 5) % V);
  Tensor ids = Tensor::from_ints(id, Shape{B, T});
  Pair table = random_pair(Shape{V, C}, 8), pos = random_pair(Shape{T, C}, 9), y = empty_pair(Shape{B, T, C});
  cpu_be().embedding_forward(ids, table.f, pos.f, y.f);
  cpu_be().embedding_forward(ids, table.h, pos.h, y.h);
  expect_rounded(y, "embedding_forward");
  Pair dy = random_pair(Shape{B, T, C}, 10);
  Tensor dtf = Tensor::zeros(Shape{V, C}), dth = Tensor::zeros(Shape{V, C}), dpf = Tensor::zeros(Shape{T, C}),
         dph = Tensor::zeros(Shape{T, C});
  ops::embedding_backward(cpu_be(), dy.f, ids, dtf, dpf);
  ops::embedding_backward(cpu_be(), dy.h, ids, dth, dph);
  EXPECT_EQ(dtf.to_vector(), dth.to_vector());
  EXPECT_EQ(dpf.to_vector(), dph.to_vector());
}

TEST_F(Bf16Ops, LinearWithinOneRoundingOfFp32) {
  // k = 1100 spans three 512-wide panels; 600 output columns two tiles.
  const int64_t rows = 70, in = 1100, out = 600;
  Pair x = random_pair(Shape{rows, in}, 11), w = random_pair(Shape{out, in}, 12), b = random_pair(Shape{out}, 13);
  Pair y = empty_pair(Shape{rows, out});
  cpu_be().linear_forward(x.f, w.f, b.f, y.f);
  cpu_be().linear_forward(x.h, w.h, b.h, y.h);
  expect_close(y, 1.0 / 128, "linear_forward");
  Pair dy = random_pair(Shape{rows, out}, 14), dx = empty_pair(Shape{rows, in});
  Tensor dwf = Tensor::zeros(Shape{out, in}), dwh = Tensor::zeros(Shape{out, in}), dbf = Tensor::zeros(Shape{out}),
         dbh = Tensor::zeros(Shape{out});
  cpu_be().linear_backward(dy.f, x.f, w.f, dx.f, dwf, dbf);
  cpu_be().linear_backward(dy.h, x.h, w.h, dx.h, dwh, dbh);
  expect_close(dx, 1.0 / 128, "linear_backward dx");
  // dw is f32 (accumulated in fp32 from bf16 inputs): only the summation order differs.
  const auto a = dwf.to_vector(), c = dwh.to_vector();
  double worst = 0, mx = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - c[i]));
    mx = std::max(mx, std::fabs(static_cast<double>(a[i])));
  }
  EXPECT_LE(worst, 1e-5 * mx);
  EXPECT_EQ(dbf.to_vector(), dbh.to_vector()) << "bias gradient: column_sums' order on the same values";
}

TEST_F(Bf16Ops, AttentionProbsRoundedOutputsClose) {
  const int64_t B = 2, T = 24, C = 32;
  const AttentionParams p{4, true, 0.2f};
  const RngState rng{3, 1000};
  Pair qkv = random_pair(Shape{B, T, 3 * C}, 15);
  Pair out = empty_pair(Shape{B, T, C}), probs = empty_pair(Shape{B, 4, T, T});
  Tensor wsf, wsh;
  {
    ActivationDTypeScope f32(DType::f32);
    wsf = Tensor::empty(Shape{static_cast<int64_t>(cpu_be().attention_forward_workspace(qkv.f.shape(), p) / 4 + 1)});
  }
  wsh = Tensor::empty(Shape{static_cast<int64_t>(cpu_be().attention_forward_workspace(qkv.h.shape(), p) / 4 + 1)});
  {
    ActivationDTypeScope f32(DType::f32);
    cpu_be().attention_forward(qkv.f, p, rng, out.f, probs.f, wsf);
  }
  cpu_be().attention_forward(qkv.h, p, rng, out.h, probs.h, wsh);
  expect_rounded(probs, "attention probs");
  expect_close(out, 1.0 / 64, "attention out");
  // Backward from the bf16 probabilities: the fp32 reference reads the same (widened) values.
  Pair dout = random_pair(Shape{B, T, C}, 16), dqkv = empty_pair(Shape{B, T, 3 * C});
  Pair probs_b = pair(widen(probs.h), probs.h.shape());
  {
    ActivationDTypeScope f32(DType::f32);
    Tensor ws =
        Tensor::empty(Shape{static_cast<int64_t>(cpu_be().attention_backward_workspace(qkv.f.shape(), p) / 4 + 1)});
    cpu_be().attention_backward(dout.f, qkv.f, probs_b.f, p, rng, dqkv.f, ws);
  }
  Tensor ws =
      Tensor::empty(Shape{static_cast<int64_t>(cpu_be().attention_backward_workspace(qkv.h.shape(), p) / 4 + 1)});
  cpu_be().attention_backward(dout.h, qkv.h, probs_b.h, p, rng, dqkv.h, ws);
  expect_close(dqkv, 1.0 / 64, "attention dqkv");
}

TEST_F(Bf16Ops, RmsNormIsTheRoundedFp32Op) {
  const int64_t n = 29, c = 72;
  Pair x = random_pair(Shape{n, c}, 17), gamma = random_pair(Shape{c}, 18), y = empty_pair(Shape{n, c});
  Tensor rf = Tensor::empty(Shape{n}), rh = Tensor::empty(Shape{n});
  cpu_be().rmsnorm_forward(x.f, gamma.f, 1e-6f, y.f, rf);
  cpu_be().rmsnorm_forward(x.h, gamma.h, 1e-6f, y.h, rh);
  expect_rounded(y, "rmsnorm_forward");
  EXPECT_EQ(rf.to_vector(), rh.to_vector());
  Pair dy = random_pair(Shape{n, c}, 19), dx = empty_pair(Shape{n, c});
  Tensor dgf = Tensor::zeros(Shape{c}), dgh = Tensor::zeros(Shape{c});
  cpu_be().rmsnorm_backward(dy.f, x.f, gamma.f, rf, dx.f, dgf);
  cpu_be().rmsnorm_backward(dy.h, x.h, gamma.h, rh, dx.h, dgh);
  expect_rounded(dx, "rmsnorm_backward dx");
  EXPECT_EQ(dgf.to_vector(), dgh.to_vector()) << "dgamma (f32) from bf16 inputs";
}

TEST_F(Bf16Ops, BatchNormAndPoolingAreTheRoundedFp32Ops) {
  const int64_t N = 5, C = 6, H = 10, W = 12;
  Pair x = random_pair(Shape{N, C, H, W}, 20), gamma = random_pair(Shape{C}, 21), beta = random_pair(Shape{C}, 22);
  Pair y = empty_pair(Shape{N, C, H, W});
  Tensor rmf = Tensor::zeros(Shape{C}), rvf = Tensor::zeros(Shape{C}), rmh = Tensor::zeros(Shape{C}),
         rvh = Tensor::zeros(Shape{C});
  Tensor smf = Tensor::empty(Shape{C}), sif = Tensor::empty(Shape{C}), smh = Tensor::empty(Shape{C}),
         sih = Tensor::empty(Shape{C});
  const BatchNormParams bp;
  cpu_be().batchnorm2d_forward_train(x.f, gamma.f, beta.f, rmf, rvf, bp, true, y.f, smf, sif);
  cpu_be().batchnorm2d_forward_train(x.h, gamma.h, beta.h, rmh, rvh, bp, true, y.h, smh, sih);
  expect_rounded(y, "batchnorm2d_forward_train");
  EXPECT_EQ(smf.to_vector(), smh.to_vector());
  EXPECT_EQ(sif.to_vector(), sih.to_vector());
  EXPECT_EQ(rvf.to_vector(), rvh.to_vector()) << "running statistics (f32)";
  cpu_be().batchnorm2d_forward_eval(x.f, gamma.f, beta.f, rmf, rvf, bp, y.f);
  cpu_be().batchnorm2d_forward_eval(x.h, gamma.h, beta.h, rmh, rvh, bp, y.h);
  expect_rounded(y, "batchnorm2d_forward_eval");
  Pair dy = random_pair(Shape{N, C, H, W}, 23);
  Tensor dgf = Tensor::zeros(Shape{C}), dbf = Tensor::zeros(Shape{C}), dgh = Tensor::zeros(Shape{C}),
         dbh = Tensor::zeros(Shape{C});
  cpu_be().batchnorm2d_backward(dy.f, x.f, gamma.f, smf, sif, dy.f, dgf, dbf);  // dx in place of dy
  cpu_be().batchnorm2d_backward(dy.h, x.h, gamma.h, smh, sih, dy.h, dgh, dbh);
  expect_rounded(dy, "batchnorm2d_backward dx (in place)");
  EXPECT_EQ(dgf.to_vector(), dgh.to_vector());
  EXPECT_EQ(dbf.to_vector(), dbh.to_vector());

  for (const Pool2dParams pp : {Pool2dParams{}, Pool2dParams{3, 3, 2, 2, 1, 1}}) {
    const int64_t P = (H + 2 * pp.pad_h - pp.kernel_h) / pp.stride_h + 1;
    const int64_t Q = (W + 2 * pp.pad_w - pp.kernel_w) / pp.stride_w + 1;
    Pair py = empty_pair(Shape{N, C, P, Q});
    Tensor idf = Tensor::empty(Shape{N, C, P, Q}, Device::cpu(), DType::u8);
    Tensor idh = Tensor::empty(Shape{N, C, P, Q}, Device::cpu(), DType::u8);
    cpu_be().maxpool2d_forward(x.f, pp, py.f, idf);
    cpu_be().maxpool2d_forward(x.h, pp, py.h, idh);
    expect_rounded(py, "maxpool2d_forward");
    EXPECT_EQ(idf.to_ints(), idh.to_ints());
    Pair pdy = random_pair(Shape{N, C, P, Q}, 24), dx = empty_pair(Shape{N, C, H, W});
    cpu_be().maxpool2d_backward(pdy.f, idf, pp, dx.f);
    cpu_be().maxpool2d_backward(pdy.h, idh, pp, dx.h);
    expect_rounded(dx, "maxpool2d_backward");
    cpu_be().avgpool2d_forward(x.f, pp, py.f);
    cpu_be().avgpool2d_forward(x.h, pp, py.h);
    expect_rounded(py, "avgpool2d_forward");
    cpu_be().avgpool2d_backward(pdy.f, pp, dx.f);
    cpu_be().avgpool2d_backward(pdy.h, pp, dx.h);
    expect_rounded(dx, "avgpool2d_backward");
  }
  Pair g = empty_pair(Shape{N, C});
  cpu_be().global_avgpool_forward(x.f, g.f);
  cpu_be().global_avgpool_forward(x.h, g.h);
  expect_rounded(g, "global_avgpool_forward");
  Pair gdy = random_pair(Shape{N, C}, 25), gdx = empty_pair(Shape{N, C, H, W});
  cpu_be().global_avgpool_backward(gdy.f, gdx.f);
  cpu_be().global_avgpool_backward(gdy.h, gdx.h);
  expect_rounded(gdx, "global_avgpool_backward");
}

// conv2d stages chunks of images in its workspace: y and dx are the rounded fp32 results
// and dw, db the fp32 ones, bitwise, on every GEMM feed and with chunks of 2 images (the
// last one partial); the first layer's f32 input (a batch) with a bf16 output works too.
TEST_F(Bf16Ops, Conv2dIsTheRoundedFp32OpOnEveryPathAndChunking) {
  const int64_t N = 5, C = 4, H = 9, W = 11, K = 8;
  struct Case {
    Conv2dParams p;
    int64_t r;
  };
  for (const Case cs : {Case{Conv2dParams{1, 1, 1, 1, 1, 1, 1}, 3}, Case{Conv2dParams{2, 2, 1, 1, 1, 1, 2}, 3},
                        Case{Conv2dParams{1, 1, 0, 0, 1, 1, 1}, 1}})
    for (const cpu_conv::Path path :
         {cpu_conv::Path::automatic, cpu_conv::Path::im2col, cpu_conv::Path::implicit, cpu_conv::Path::direct})
      for (const int64_t chunk : {int64_t{0}, int64_t{2}}) {
        SCOPED_TRACE(std::string(cpu_conv::path_name(path)) + " chunk " + std::to_string(chunk) + " groups " +
                     std::to_string(cs.p.groups) + " stride " + std::to_string(cs.p.stride_h));
        cpu_conv::set_path(path);
        cpu_conv::set_chunk_images(chunk);
        const Conv2dParams& p = cs.p;
        const int64_t P = (H + 2 * p.pad_h - cs.r) / p.stride_h + 1, Q = (W + 2 * p.pad_w - cs.r) / p.stride_w + 1;
        Pair x = random_pair(Shape{N, C, H, W}, 26), w = random_pair(Shape{K, C / p.groups, cs.r, cs.r}, 27),
             b = random_pair(Shape{K}, 28), y = empty_pair(Shape{N, K, P, Q});
        auto ws = [&](size_t bytes) { return Tensor::empty(Shape{static_cast<int64_t>(bytes / 4 + 1)}); };
        Tensor wsf, wsb_f;
        {
          ActivationDTypeScope f32(DType::f32);
          wsf = ws(cpu_be().conv2d_forward_workspace(x.f.shape(), w.f.shape(), p));
          wsb_f = ws(cpu_be().conv2d_backward_workspace(x.f.shape(), w.f.shape(), p));
          cpu_be().conv2d_forward(x.f, w.f, b.f, p, y.f, wsf);
        }
        Tensor wsh = ws(cpu_be().conv2d_forward_workspace(x.h.shape(), w.h.shape(), p));
        EXPECT_GT(wsh.nbytes(), wsf.nbytes()) << "the bf16 staging is workspace";
        cpu_be().conv2d_forward(x.h, w.h, b.h, p, y.h, wsh);
        expect_rounded(y, "conv2d_forward");
        Pair y_from_f32 = empty_pair(Shape{N, K, P, Q});  // f32 input, bf16 output
        cpu_be().conv2d_forward(x.f, w.h, b.h, p, y_from_f32.h, wsh);
        EXPECT_EQ(bits(y_from_f32.h), bits(y.h));

        Pair dy = random_pair(Shape{N, K, P, Q}, 29), dx = empty_pair(Shape{N, C, H, W});
        Tensor dwf = Tensor::zeros(w.f.shape()), dwh = Tensor::zeros(w.f.shape()), dbf = Tensor::zeros(Shape{K}),
               dbh = Tensor::zeros(Shape{K});
        {
          ActivationDTypeScope f32(DType::f32);
          cpu_be().conv2d_backward(dy.f, x.f, w.f, p, dx.f, dwf, dbf, wsb_f);
        }
        Tensor wsb_h = ws(cpu_be().conv2d_backward_workspace(x.h.shape(), w.h.shape(), p));
        cpu_be().conv2d_backward(dy.h, x.h, w.h, p, dx.h, dwh, dbh, wsb_h);
        expect_rounded(dx, "conv2d_backward dx");
        EXPECT_EQ(dwf.to_vector(), dwh.to_vector()) << "dw";
        EXPECT_EQ(dbf.to_vector(), dbh.to_vector()) << "db";
      }
  cpu_conv::set_path(cpu_conv::Path::automatic);
  cpu_conv::set_chunk_images(0);
}

}  // namespace

namespace {

// The message of the error f throws (empty when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

}  // namespace

// Statistics stay f32 under bf16 activations: a bf16 mean, rstd, lse, loss or batch-norm
// statistic is refused by the validator (every backend), the error naming the op and the
// tensor; and permute_0213 copies one dtype (x and y alike).
TEST_F(Bf16Ops, StatisticsMustBeF32AndPermuteKeepsItsDtype) {
  const Shape s{4, 8};
  Pair x = random_pair(s, 30), g = random_pair(Shape{8}, 31), y = empty_pair(s);
  Tensor st32 = Tensor::empty(Shape{4}), st16 = Tensor::empty(Shape{4}, Device::cpu(), DType::bf16);
  auto expect_stat = [](const std::string& msg, const std::string& op, const std::string& tensor) {
    EXPECT_NE(msg.find(op + ": " + tensor + " bf16["), std::string::npos) << msg;
    EXPECT_NE(msg.find("expected dtype f32 (statistics stay f32 under bf16 activations)"), std::string::npos) << msg;
  };
  expect_stat(error_of([&] { cpu_be().layernorm_forward(x.h, g.h, g.h, 1e-5f, y.h, st16, st32); }), "layernorm_forward",
              "mean");
  expect_stat(error_of([&] { cpu_be().layernorm_forward(x.h, g.h, g.h, 1e-5f, y.h, st32, st16); }), "layernorm_forward",
              "rstd");
  expect_stat(error_of([&] { ops::layernorm_backward(cpu_be(), x.h, x.h, g.h, st32, st16, y.h, Tensor(), Tensor()); }),
              "layernorm_backward", "rstd");
  expect_stat(error_of([&] { cpu_be().rmsnorm_forward(x.h, g.h, 1e-6f, y.h, st16); }), "rmsnorm_forward", "rstd");
  expect_stat(error_of([&] { cpu_be().rmsnorm_backward(x.h, x.h, g.h, st16, y.h, Tensor()); }), "rmsnorm_backward",
              "rstd");
  Tensor targets = Tensor::from_ints({0, 1, 2, 3}, Shape{4});
  Tensor loss16 = Tensor::empty(Shape{1}, Device::cpu(), DType::bf16), loss32 = Tensor::empty(Shape{1});
  expect_stat(error_of([&] { cpu_be().cross_entropy_forward(x.h, targets, -100, loss16, st32); }),
              "cross_entropy_forward", "loss");
  expect_stat(error_of([&] { cpu_be().cross_entropy_forward(x.h, targets, -100, loss32, st16); }),
              "cross_entropy_forward", "lse");
  expect_stat(error_of([&] { cpu_be().cross_entropy_backward(1.0f, x.h, targets, st16, -100, y.h); }),
              "cross_entropy_backward", "lse");
  const Shape xs{2, 4, 3, 3}, cs{4};
  Pair bx = random_pair(xs, 32), bg = random_pair(cs, 33), by = empty_pair(xs);
  Tensor c32 = Tensor::zeros(cs), c16 = Tensor::zeros(cs, Device::cpu(), DType::bf16);
  const BatchNormParams bp;
  expect_stat(
      error_of([&] { cpu_be().batchnorm2d_forward_train(bx.h, bg.h, bg.h, c32, c32, bp, true, by.h, c16, c32); }),
      "batchnorm2d_forward_train", "save_mean");
  expect_stat(
      error_of([&] { cpu_be().batchnorm2d_forward_train(bx.h, bg.h, bg.h, c32, c16, bp, true, by.h, c32, c32); }),
      "batchnorm2d_forward_train", "running_var");
  expect_stat(error_of([&] { cpu_be().batchnorm2d_forward_eval(bx.h, bg.h, bg.h, c16, c32, bp, by.h); }),
              "batchnorm2d_forward_eval", "running_mean");
  expect_stat(error_of([&] { cpu_be().batchnorm2d_backward(bx.h, bx.h, bg.h, c32, c16, by.h, c32, c32); }),
              "batchnorm2d_backward", "save_invstd");
  // gamma and beta may be bf16 working copies: the same calls with f32 statistics run.
  EXPECT_EQ(error_of([&] { cpu_be().batchnorm2d_forward_train(bx.h, bg.h, bg.h, c32, c32, bp, true, by.h, c32, c32); }),
            "");
  EXPECT_EQ(error_of([&] { cpu_be().layernorm_forward(x.h, g.h, g.h, 1e-5f, y.h, st32, st32); }), "");

  Pair p = random_pair(Shape{2, 3, 4, 5}, 34);
  Tensor q32 = Tensor::empty(Shape{2, 4, 3, 5});
  const std::string msg = error_of([&] { cpu_be().permute_0213(p.h, q32); });
  EXPECT_NE(msg.find("permute_0213: x bf16[2, 3, 4, 5] on cpu and y f32[2, 4, 3, 5] on cpu"), std::string::npos) << msg;
  EXPECT_NE(msg.find("need one dtype"), std::string::npos) << msg;
}

// cast_multi (the working-copy refresh): every f32 -> bf16 pair is scale(src, 1, dst)'s bits
// (one rounding to nearest even: ties, subnormals, overflow, NaN), bf16 -> f32 is exact and a
// pair of one dtype a copy; tensors of any size in one call.
TEST_F(Bf16Ops, CastMultiIsScaleByOnePerTensor) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<Tensor> src, dst, want;
  const std::vector<float> edge = {1.00390625f, 1.01171875f, -1.00390625f, 3.3895314e38f, -3.4e38f, 1e-40f,
                                   -1e-45f,     nan,         inf,          -inf,          0.0f,     -0.0f};
  src.push_back(Tensor::from_vector(edge, Shape{static_cast<int64_t>(edge.size())}));
  std::mt19937 gen(40);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{2048}, int64_t{2049}, int64_t{70001}}) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = u(gen);
    src.push_back(Tensor::from_vector(v, Shape{n}));
  }
  for (const Tensor& s : src) {
    dst.push_back(Tensor::empty(s.shape(), Device::cpu(), DType::bf16));
    want.push_back(Tensor::empty(s.shape(), Device::cpu(), DType::bf16));
    cpu_be().scale(s, 1.0f, want.back());
  }
  Pair h = random_pair(Shape{3, 7}, 41);  // bf16 -> f32, and f32 -> f32
  Tensor widened = Tensor::empty(h.h.shape()), copied = Tensor::empty(h.f.shape());
  src.push_back(h.h);
  dst.push_back(widened);
  src.push_back(h.f);
  dst.push_back(copied);
  cpu_be().cast_multi(src, dst);
  for (size_t i = 0; i + 2 < src.size(); ++i)
    EXPECT_EQ(bits(dst[i]), bits(want[i])) << "tensor " << i << " " << src[i].str();
  EXPECT_EQ(widened.to_vector(), h.f.to_vector());
  EXPECT_EQ(copied.to_vector(), h.f.to_vector());
  // Mismatched lists and shapes are errors naming the op.
  EXPECT_NE(error_of([&] { cpu_be().cast_multi(src, {}); }).find("cast_multi: 9 sources but 0 destinations"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              cpu_be().cast_multi({h.f}, {Tensor::empty(Shape{7, 3}, Device::cpu(), DType::bf16)});
            }).find("cast_multi: src 0 f32[3, 7] on cpu and dst bf16[7, 3] on cpu must have the same shape"),
            std::string::npos);
}
