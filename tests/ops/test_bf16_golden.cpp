// The CPU backend's bf16 ops against PyTorch 1.13 on the CPU (goldens written by
// tools/golden/bf16_ops.py), two references per result:
//  - `_f32`: PyTorch's float32 op on the same (bf16) values, stored results rounded to bf16
//    and parameter gradients kept in fp32: remat's contract ("bf16 storage, fp32 math").
//    Tight: bf16 results are the reference's bits (0 ulp) but for GEMMs and convolutions
//    (another summation order may move a rounding by one step) and attention's backward (3:
//    it reads the stored bf16 probabilities where the reference's softmax backward reads its
//    fp32 ones); f32 results (parameter gradients, the loss) within 0.01 ulp (fp32 sums in
//    another order).
//  - PyTorch's own bfloat16 kernels. Several round intermediates to bf16 (the tanh GELU,
//    layer norm, batch norm, attention's scores and probabilities, the embedding and
//    average-pool gradients that add in bf16, bf16 parameter gradients), so remat is
//    checked within the error those roundings make, stated per op below.
// err = max_i |remat_i - ref_i| / (|ref_i| + 2^-6 max_j |ref_j|), in units of bf16's
// relative step 2^-8 ("ulp").
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backends/cpu/bf16.h"
#include "remat/backend.h"
#include "remat/dtype.h"
#include "remat/ops.h"
#include "support/golden.h"

using namespace remat;
using remat::test::load_golden;

namespace {

constexpr double kUlp = 1.0 / 256;  // bf16's relative step (8 significant bits)

Backend& be() { return backend_for(Device::cpu()); }

// A golden tensor (f32 holding bf16 values) as a bf16 tensor.
Tensor bf16_of(const Tensor& f) {
  Tensor h = Tensor::empty(f.shape(), Device::cpu(), DType::bf16);
  cpu::f32_to_bf16(f.f32(), h.bf16(), f.numel());
  return h;
}
Tensor bf16_empty(const Shape& s) { return Tensor::empty(s, Device::cpu(), DType::bf16); }

// err above, in ulps.
double err_ulps(const Tensor& actual, const Tensor& expected) {
  const std::vector<float> a = actual.to_vector(), e = expected.to_vector();
  EXPECT_EQ(a.size(), e.size());
  double mx = 0;
  for (float v : e) mx = std::max(mx, std::fabs(static_cast<double>(v)));
  const double floor = std::ldexp(mx, -6);
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < e.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(e[i])) return a[i] == e[i] ? 0.0 : HUGE_VAL;
    const double d = std::fabs(static_cast<double>(a[i]) - e[i]);
    worst = std::max(worst, d / (std::fabs(static_cast<double>(e[i])) + floor));
  }
  return worst / kUlp;
}

// Checks remat's `actual` for golden result `name` of case f: within `f32_ulps` of the fp32
// reference and `torch_ulps` of PyTorch's bf16 kernel.
void check(const SafetensorsFile& f, const std::string& name, const Tensor& actual, double f32_ulps,
           double torch_ulps) {
  const double e32 = err_ulps(actual, f.tensor(name + "_f32")), e16 = err_ulps(actual, f.tensor(name));
  std::printf("    %-8s %6.2f ulp from fp32 (allowed %g), %6.2f from torch bf16 (allowed %g)\n", name.c_str(), e32,
              f32_ulps, e16, torch_ulps);
  EXPECT_LE(e32, f32_ulps) << name << " against PyTorch's fp32 op on the same values";
  EXPECT_LE(e16, torch_ulps) << name << " against PyTorch's bf16 kernel";
}

class Bf16Golden : public ::testing::Test {
 protected:
  ActivationDTypeScope scope_{DType::bf16};
  static Tensor in(const SafetensorsFile& f, const char* name) { return bf16_of(f.tensor(name)); }
};

TEST_F(Bf16Golden, Linear) {
  auto f = load_golden("bf16_ops/linear");
  Tensor x = in(f, "x"), w = in(f, "w"), b = in(f, "b");
  Tensor y = bf16_empty(f.tensor("y").shape());
  be().linear_forward(x, w, b, y);
  check(f, "y", y, 1, 1);
  Tensor dx = bf16_empty(x.shape()), dw = Tensor::zeros(w.shape()), db = Tensor::zeros(b.shape());
  be().linear_backward(in(f, "dy"), x, w, dx, dw, db);
  check(f, "dx", dx, 1, 1);
  check(f, "dw", dw, 1, 1);
  check(f, "db", db, 1, 1);
}

TEST_F(Bf16Golden, Pointwise) {
  for (const char* name : {"gelu_erf", "gelu_tanh", "relu"}) {
    SCOPED_TRACE(name);
    std::printf("  %s\n", name);
    auto f = load_golden(std::string("bf16_ops/") + name);
    Tensor x = in(f, "x"), y = bf16_empty(x.shape()), dx = bf16_empty(x.shape());
    const std::string n = name;
    if (n == "relu") {
      be().relu_forward(x, y);
      be().relu_backward(in(f, "dy"), x, dx);
    } else {
      const GeluApprox a = n == "gelu_tanh" ? GeluApprox::tanh : GeluApprox::none;
      be().gelu_forward(x, a, y);
      be().gelu_backward(in(f, "dy"), x, a, dx);
    }
    // PyTorch 1.13's bf16 tanh GELU rounds its intermediates to bf16 (the erf one does not).
    const bool tanh = n == "gelu_tanh";
    check(f, "y", y, 0, tanh ? 16 : 0);
    check(f, "dx", dx, 0, tanh ? 64 : 0);
  }
  auto f = load_golden("bf16_ops/add");
  Tensor y = bf16_empty(f.tensor("x").shape());
  be().add(in(f, "x"), in(f, "x2"), y);
  check(f, "y", y, 0, 0);
}

TEST_F(Bf16Golden, LayerNormAndRmsNorm) {
  auto f = load_golden("bf16_ops/layernorm");
  Tensor x = in(f, "x"), gamma = in(f, "gamma");
  const int64_t n = x.size(0), c = x.size(1);
  Tensor y = bf16_empty(x.shape()), dx = bf16_empty(x.shape());
  Tensor mean = Tensor::empty(Shape{n}), rstd = Tensor::empty(Shape{n});
  be().layernorm_forward(x, gamma, in(f, "beta"), static_cast<float>(remat::test::meta_float(f, "eps")), y, mean, rstd);
  // PyTorch's bf16 layer norm rounds the normalised values (and its backward's partial
  // products) to bf16 before applying gamma and beta.
  check(f, "y", y, 0, 24);
  Tensor dgamma = Tensor::zeros(Shape{c}), dbeta = Tensor::zeros(Shape{c});
  ops::layernorm_backward(be(), in(f, "dy"), x, gamma, mean, rstd, dx, dgamma, dbeta);
  check(f, "dx", dx, 0, 12);
  check(f, "dgamma", dgamma, 0.01, 24);
  check(f, "dbeta", dbeta, 0.01, 20);

  auto r = load_golden("bf16_ops/rmsnorm");
  Tensor rs = Tensor::empty(Shape{n}), dg = Tensor::zeros(Shape{c});
  be().rmsnorm_forward(in(r, "x"), in(r, "gamma"), static_cast<float>(remat::test::meta_float(r, "eps")), y, rs);
  check(r, "y", y, 0, 0);  // written out in fp32 inside for both references
  be().rmsnorm_backward(in(r, "dy"), in(r, "x"), in(r, "gamma"), rs, dx, dg);
  check(r, "dx", dx, 0, 0);
  check(r, "dgamma", dg, 0.01, 1);  // PyTorch's bf16 parameter gradient is rounded once
}

TEST_F(Bf16Golden, SoftmaxAndCrossEntropy) {
  for (const bool log : {false, true}) {
    auto f = load_golden(log ? "bf16_ops/log_softmax" : "bf16_ops/softmax");
    std::printf("  %s\n", log ? "log_softmax" : "softmax");
    Tensor x = in(f, "x"), y = bf16_empty(x.shape()), dx = bf16_empty(x.shape());
    be().softmax_forward(x, log, y);
    check(f, "y", y, 0, 2);
    // From remat's bf16 y, as in training; PyTorch's bf16 kernels round exp(y) and the row
    // sums to bf16 (log-softmax's dx cancels: dy - exp(y) sum(dy)).
    be().softmax_backward(in(f, "dy"), y, log, dx);
    check(f, "dx", dx, 0, log ? 48 : 2);
  }
  auto f = load_golden("bf16_ops/cross_entropy");
  Tensor x = in(f, "x"), dx = bf16_empty(x.shape());
  Tensor loss = Tensor::empty(Shape{1}), lse = Tensor::empty(Shape{x.size(0)});
  const Tensor& targets = f.tensor("targets");
  be().cross_entropy_forward(x, targets, -100, loss, lse);
  check(f, "y", loss, 0.01, 2);  // remat's loss is f32; PyTorch's bf16 loss is rounded
  be().cross_entropy_backward(1.0f, x, targets, lse, -100, dx);
  check(f, "dx", dx, 0, 4);
}

TEST_F(Bf16Golden, Embedding) {
  auto f = load_golden("bf16_ops/embedding");
  const Tensor& ids = f.tensor("ids");
  Tensor table = in(f, "table"), pos = in(f, "pos");
  Tensor y = bf16_empty(f.tensor("y").shape());
  be().embedding_forward(ids, table, pos, y);
  check(f, "y", y, 0, 0);
  Tensor dt = Tensor::zeros(table.shape()), dp = Tensor::zeros(pos.shape());
  ops::embedding_backward(be(), in(f, "dy"), ids, dt, dp);
  check(f, "dtable", dt, 0.01, 8);  // PyTorch adds a repeated id's rows in bf16; remat in fp32
  check(f, "dpos", dp, 0.01, 1);
}

TEST_F(Bf16Golden, Attention) {
  auto f = load_golden("bf16_ops/attention");
  Tensor qkv = in(f, "qkv");
  const AttentionParams p{static_cast<int>(remat::test::meta_int(f, "heads")), true, 0.0f};
  const int64_t b = qkv.size(0), t = qkv.size(1);
  Tensor out = bf16_empty(f.tensor("y").shape()), probs = bf16_empty(Shape{b, p.n_head, t, t});
  Tensor ws = Tensor::empty(Shape{static_cast<int64_t>(be().attention_forward_workspace(qkv.shape(), p) / 4 + 1)});
  be().attention_forward(qkv, p, RngState{}, out, probs, ws);
  // PyTorch's bf16 attention rounds the scores (and P V's output) to bf16 as well.
  check(f, "y", out, 0, 16);
  Tensor dqkv = bf16_empty(qkv.shape());
  Tensor wsb = Tensor::empty(Shape{static_cast<int64_t>(be().attention_backward_workspace(qkv.shape(), p) / 4 + 1)});
  be().attention_backward(in(f, "dy"), qkv, probs, p, RngState{}, dqkv, wsb);
  // The fp32 reference's softmax backward reads its fp32 probabilities, remat the stored bf16
  // ones; PyTorch's bf16 backward also rounds dP, dS and the GEMM outputs.
  check(f, "dqkv", dqkv, 3, 8);
}

TEST_F(Bf16Golden, Conv2d) {
  auto f = load_golden("bf16_ops/conv2d");
  Conv2dParams p;
  p.pad_h = p.pad_w = static_cast<int>(remat::test::meta_int(f, "padding"));
  p.groups = static_cast<int>(remat::test::meta_int(f, "groups"));
  Tensor x = in(f, "x"), w = in(f, "w"), b = in(f, "b");
  Tensor y = bf16_empty(f.tensor("y").shape());
  Tensor ws =
      Tensor::empty(Shape{static_cast<int64_t>(be().conv2d_forward_workspace(x.shape(), w.shape(), p) / 4 + 1)});
  be().conv2d_forward(x, w, b, p, y, ws);
  check(f, "y", y, 1, 1);  // GEMMs: another summation order may move a rounding by one step
  Tensor dx = bf16_empty(x.shape()), dw = Tensor::zeros(w.shape()), db = Tensor::zeros(b.shape());
  Tensor wsb =
      Tensor::empty(Shape{static_cast<int64_t>(be().conv2d_backward_workspace(x.shape(), w.shape(), p) / 4 + 1)});
  be().conv2d_backward(in(f, "dy"), x, w, p, dx, dw, db, wsb);
  check(f, "dx", dx, 1, 1);
  check(f, "dw", dw, 1, 1);
  check(f, "db", db, 1, 1);
}

TEST_F(Bf16Golden, BatchNorm) {
  auto f = load_golden("bf16_ops/batchnorm");
  Tensor x = in(f, "x"), gamma = in(f, "gamma");
  const int64_t c = x.size(1);
  Tensor rm = Tensor::zeros(Shape{c}), rv = Tensor::zeros(Shape{c});
  Tensor sm = Tensor::empty(Shape{c}), si = Tensor::empty(Shape{c});
  Tensor y = bf16_empty(x.shape());
  BatchNormParams bp;
  bp.eps = static_cast<float>(remat::test::meta_float(f, "eps"));
  be().batchnorm2d_forward_train(x, gamma, in(f, "beta"), rm, rv, bp, false, y, sm, si);
  // PyTorch's bf16 batch norm rounds its normalised values and statistics to bf16.
  check(f, "y", y, 0, 24);
  Tensor dx = bf16_empty(x.shape()), dgamma = Tensor::zeros(Shape{c}), dbeta = Tensor::zeros(Shape{c});
  be().batchnorm2d_backward(in(f, "dy"), x, gamma, sm, si, dx, dgamma, dbeta);
  check(f, "dx", dx, 0, 8);
  check(f, "dgamma", dgamma, 0.01, 2);
  check(f, "dbeta", dbeta, 0.01, 1);
}

TEST_F(Bf16Golden, Pooling) {
  const Pool2dParams maxp{2, 2, 2, 2, 0, 0}, avgp{3, 3, 2, 2, 1, 1};
  {
    auto f = load_golden("bf16_ops/maxpool");
    std::printf("  maxpool\n");
    Tensor x = in(f, "x"), y = bf16_empty(f.tensor("y").shape()), dx = bf16_empty(x.shape());
    Tensor idx = Tensor::empty(y.shape(), Device::cpu(), DType::u8);
    be().maxpool2d_forward(x, maxp, y, idx);
    check(f, "y", y, 0, 0);
    be().maxpool2d_backward(in(f, "dy"), idx, maxp, dx);
    check(f, "dx", dx, 0, 0);
  }
  {
    auto f = load_golden("bf16_ops/avgpool");
    std::printf("  avgpool\n");
    Tensor x = in(f, "x"), y = bf16_empty(f.tensor("y").shape()), dx = bf16_empty(x.shape());
    be().avgpool2d_forward(x, avgp, y);
    check(f, "y", y, 0, 1);
    be().avgpool2d_backward(in(f, "dy"), avgp, dx);
    check(f, "dx", dx, 0, 12);  // PyTorch adds overlapping windows' shares in bf16
  }
  {
    auto f = load_golden("bf16_ops/global_avgpool");
    std::printf("  global_avgpool\n");
    Tensor x = in(f, "x"), y = bf16_empty(f.tensor("y").shape()), dx = bf16_empty(x.shape());
    be().global_avgpool_forward(x, y);
    check(f, "y", y, 0, 2);
    be().global_avgpool_backward(in(f, "dy"), dx);
    check(f, "dx", dx, 0, 1);
  }
}

}  // namespace
