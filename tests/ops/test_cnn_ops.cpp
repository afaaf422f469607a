// The CNN op family of the CPU backend (conv2d, max/avg/global-avg pooling, batchnorm2d):
// PyTorch goldens (tools/golden/cnn.py), finite differences, a direct-loop convolution
// reference, conv2d's three ways of feeding its GEMMs and its micro-kernels against each
// other, its workspace use, determinism (run to run and across thread counts), errors, and
// the meta backend's memory accounting.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/conv_internal.h"
#include "remat/backend.h"
#include "remat/memory.h"
#include "remat/ops.h"
#include "support/expect_error.h"
#include "support/golden.h"
#include "support/gradcheck.h"

namespace {

using remat::Backend;
using remat::BatchNormParams;
using remat::Conv2dParams;
using remat::Device;
using remat::DType;
using remat::Pool2dParams;
using remat::SafetensorsFile;
using remat::Shape;
using remat::Tensor;
using remat::test::all_close;
using remat::test::bitwise_equal;
using remat::test::check_gradient;
using remat::test::dot;
using remat::test::golden_cases;
using remat::test::GradCheckOptions;
using remat::test::load_golden;
using remat::test::meta_float;
using remat::test::meta_int;
using remat::test::random_tensor;
namespace ops = remat::ops;

// Tolerances against PyTorch and the double-precision references. Values are O(1) sums of
// at most a few hundred fp32 products, accumulated in another order than PyTorch's: errors
// of a few ulp of the largest partial sum, ~1e-6. rtol 1e-4 / atol 1e-5 leaves margin
// without hiding a wrong index or a missed term (O(0.01) to O(1) errors).
constexpr double kRtol = 1e-4;
constexpr double kAtol = 1e-5;

Backend& cpu() { return remat::backend_for(Device::cpu()); }

// The flat h * W + w positions in their planes that max pooling's window offsets (u8,
// r * kernel_w + c from each window's top-left corner in padded coordinates) name.
std::vector<int32_t> flat_positions(const Tensor& indices, const Shape& x, const Pool2dParams& p) {
  const auto off = indices.to_ints();
  const int64_t pq = indices.size(2) * indices.size(3), q = indices.size(3);
  std::vector<int32_t> out(off.size());
  for (size_t e = 0; e < off.size(); ++e) {
    const int64_t o = static_cast<int64_t>(e) % pq, pp = o / q, qq = o % q;
    const int64_t hh = pp * p.stride_h - p.pad_h + off[e] / p.kernel_w;
    const int64_t ww = qq * p.stride_w - p.pad_w + off[e] % p.kernel_w;
    out[e] = static_cast<int32_t>(hh * x[3] + ww);
  }
  return out;
}
Backend& meta() { return remat::backend_for(Device::meta()); }

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

std::vector<std::string> cases_with_prefix(const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& c : golden_cases("cnn"))
    if (starts_with(c, "cnn/" + prefix)) out.push_back(c);
  return out;
}

Conv2dParams conv_params(const SafetensorsFile& f) {
  Conv2dParams p;
  p.stride_h = static_cast<int>(meta_int(f, "stride_h"));
  p.stride_w = static_cast<int>(meta_int(f, "stride_w"));
  p.pad_h = static_cast<int>(meta_int(f, "pad_h"));
  p.pad_w = static_cast<int>(meta_int(f, "pad_w"));
  p.dilation_h = static_cast<int>(meta_int(f, "dilation_h"));
  p.dilation_w = static_cast<int>(meta_int(f, "dilation_w"));
  p.groups = static_cast<int>(meta_int(f, "groups"));
  return p;
}

Pool2dParams pool_params(const SafetensorsFile& f) {
  Pool2dParams p;
  p.kernel_h = static_cast<int>(meta_int(f, "kernel_h"));
  p.kernel_w = static_cast<int>(meta_int(f, "kernel_w"));
  p.stride_h = static_cast<int>(meta_int(f, "stride_h"));
  p.stride_w = static_cast<int>(meta_int(f, "stride_w"));
  p.pad_h = static_cast<int>(meta_int(f, "pad_h"));
  p.pad_w = static_cast<int>(meta_int(f, "pad_w"));
  return p;
}

Tensor filled(const Shape& s, float v) { return Tensor::full(s, v); }

// a + b elementwise (host), for expected accumulations.
Tensor plus(const Tensor& a, const Tensor& b) {
  auto x = a.to_vector();
  const auto y = b.to_vector();
  for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
  return Tensor::from_vector(x, a.shape());
}

// Restores the OpenMP thread count when it goes out of scope.
class ThreadCount {
 public:
  ThreadCount() : saved_(omp_get_max_threads()) {}
  ~ThreadCount() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

// Restores the conv2d micro-kernel, path selection and chunking when it goes out of scope.
class ConvMode {
 public:
  ConvMode()
      : kernel_(remat::cpu_conv::micro_kernel()),
        path_(remat::cpu_conv::path()),
        chunk_(remat::cpu_conv::chunk_images()) {}
  ~ConvMode() {
    remat::cpu_conv::use_micro_kernel(kernel_);
    remat::cpu_conv::set_path(path_);
    remat::cpu_conv::set_chunk_images(chunk_);
  }

 private:
  std::string kernel_;
  remat::cpu_conv::Path path_;
  int64_t chunk_;
};

using ConvPath = remat::cpu_conv::Path;

// How conv2d feeds its GEMMs: chosen from the shapes, or one way forced wherever it
// applies (im2col, the implicit GEMM of stride 1, the direct tiles); chunks chosen from
// the shapes, or of 2 images (several chunks, the last one partial, on the small shapes
// of the tests).
struct PathMode {
  ConvPath path;
  int64_t chunk_images;
  std::string str() const {
    return std::string(remat::cpu_conv::path_name(path)) + ", " +
           (chunk_images ? "chunks of " + std::to_string(chunk_images) : std::string("automatic chunks"));
  }
  void apply() const {
    remat::cpu_conv::set_path(path);
    remat::cpu_conv::set_chunk_images(chunk_images);
  }
};
const std::vector<PathMode> kAllPathModes = {
    {ConvPath::automatic, 0}, {ConvPath::automatic, 2}, {ConvPath::im2col, 0}, {ConvPath::im2col, 2},
    {ConvPath::implicit, 0},  {ConvPath::implicit, 2},  {ConvPath::direct, 0}, {ConvPath::direct, 2}};

// ---- PyTorch goldens ------------------------------------------------------------------------

// Both ways of feeding the GEMM (explicit im2col, and the implicit one of stride-1
// convolutions where it applies) against PyTorch.
TEST(CnnGolden, Conv2dForwardBackward) {
  const auto names = cases_with_prefix("conv_");
  ASSERT_GE(names.size(), 8u) << "conv goldens missing: run tools/gen_golden.py cnn";
  ConvMode restore;
  for (const PathMode& mode : kAllPathModes) {
    mode.apply();
    for (const auto& name : names) {
      SCOPED_TRACE(name + " (" + mode.str() + ")");
      const auto f = load_golden(name);
      const Conv2dParams p = conv_params(f);
      const Tensor x = f.tensor("x"), w = f.tensor("w");
      const bool has_bias = meta_int(f, "bias") != 0;
      const Tensor b = has_bias ? f.tensor("b") : Tensor();
      EXPECT_ALL_CLOSE(ops::conv2d(cpu(), x, w, b, p), f.tensor("y"), kRtol, kAtol);

      // dx is overwritten (starts as NaN); dw and db accumulate onto what they hold.
      const Tensor dx = filled(x.shape(), std::nanf(""));
      const Tensor dw0 = random_tensor(w.shape(), 7), dw = dw0.clone();
      const Tensor db0 = has_bias ? random_tensor(b.shape(), 8) : Tensor(), db = has_bias ? db0.clone() : Tensor();
      const Tensor ws = ops::workspace(cpu(), cpu().conv2d_backward_workspace(x.shape(), w.shape(), p));
      cpu().conv2d_backward(f.tensor("dy"), x, w, p, dx, dw, db, ws);
      EXPECT_ALL_CLOSE(dx, f.tensor("dx"), kRtol, kAtol);
      EXPECT_ALL_CLOSE(dw, plus(dw0, f.tensor("dw")), kRtol, kAtol);
      if (has_bias) {
        EXPECT_ALL_CLOSE(db, plus(db0, f.tensor("db")), kRtol, kAtol);
      }

      // Only some gradients requested: the others are skipped, the rest unchanged.
      const Tensor dw_only = Tensor::zeros(w.shape());
      EXPECT_FALSE(ops::conv2d_backward(cpu(), f.tensor("dy"), x, w, p, false, dw_only, Tensor()).defined());
      EXPECT_ALL_CLOSE(dw_only, f.tensor("dw"), kRtol, kAtol);
      EXPECT_ALL_CLOSE(ops::conv2d_backward(cpu(), f.tensor("dy"), x, w, p, true, Tensor(), Tensor()), f.tensor("dx"),
                       kRtol, kAtol);
    }
  }
}

TEST(CnnGolden, MaxPool2d) {
  const auto names = cases_with_prefix("maxpool_");
  ASSERT_GE(names.size(), 4u);
  for (const auto& name : names) {
    SCOPED_TRACE(name);
    const auto f = load_golden(name);
    const Pool2dParams p = pool_params(f);
    const auto r = ops::maxpool2d(cpu(), f.tensor("x"), p);
    // The max is one of the inputs: exact.
    EXPECT_TRUE(bitwise_equal(r.y, f.tensor("y")));
    // ties: PyTorch's first maximum (PyTorch saves flat positions; we save window offsets)
    EXPECT_EQ(flat_positions(r.indices, f.tensor("x").shape(), p), f.tensor("indices").to_ints());
    const Tensor dx = filled(f.tensor("x").shape(), std::nanf(""));
    cpu().maxpool2d_backward(f.tensor("dy"), r.indices, p, dx);
    EXPECT_ALL_CLOSE(dx, f.tensor("dx"), kRtol, kAtol);
  }
}

TEST(CnnGolden, AvgPool2d) {
  const auto names = cases_with_prefix("avgpool_");
  ASSERT_GE(names.size(), 3u);
  for (const auto& name : names) {
    SCOPED_TRACE(name);
    const auto f = load_golden(name);
    const Pool2dParams p = pool_params(f);
    EXPECT_ALL_CLOSE(ops::avgpool2d(cpu(), f.tensor("x"), p), f.tensor("y"), kRtol, kAtol);
    const Tensor dx = filled(f.tensor("x").shape(), std::nanf(""));
    cpu().avgpool2d_backward(f.tensor("dy"), p, dx);
    EXPECT_ALL_CLOSE(dx, f.tensor("dx"), kRtol, kAtol);
  }
}

TEST(CnnGolden, GlobalAvgPool) {
  const auto names = cases_with_prefix("global_avgpool_");
  ASSERT_GE(names.size(), 2u);
  for (const auto& name : names) {
    SCOPED_TRACE(name);
    const auto f = load_golden(name);
    EXPECT_ALL_CLOSE(ops::global_avgpool(cpu(), f.tensor("x")), f.tensor("y"), kRtol, kAtol);
    const Tensor dx = filled(f.tensor("x").shape(), std::nanf(""));
    cpu().global_avgpool_backward(f.tensor("dy"), dx);
    EXPECT_ALL_CLOSE(dx, f.tensor("dx"), kRtol, kAtol);
  }
}

TEST(CnnGolden, BatchNormTrain) {
  const auto names = cases_with_prefix("bn_train");
  ASSERT_GE(names.size(), 2u);
  for (const auto& name : names) {
    SCOPED_TRACE(name);
    const auto f = load_golden(name);
    BatchNormParams p;
    p.momentum = static_cast<float>(meta_float(f, "momentum"));
    p.eps = static_cast<float>(meta_float(f, "eps"));
    const Tensor x = f.tensor("x"), gamma = f.tensor("gamma"), beta = f.tensor("beta");
    const Tensor rm = f.tensor("running_mean"), rv = f.tensor("running_var");
    const auto r = ops::batchnorm2d_train(cpu(), x, gamma, beta, rm, rv, p, true);
    EXPECT_ALL_CLOSE(r.y, f.tensor("y"), kRtol, kAtol);
    EXPECT_ALL_CLOSE(r.mean, f.tensor("save_mean"), kRtol, kAtol);
    EXPECT_ALL_CLOSE(r.invstd, f.tensor("save_invstd"), kRtol, kAtol);
    EXPECT_ALL_CLOSE(rm, f.tensor("running_mean_new"), kRtol, kAtol);
    EXPECT_ALL_CLOSE(rv, f.tensor("running_var_new"), kRtol, kAtol);

    // Recompute (update_running = false): the same outputs, running statistics untouched.
    const Tensor rm2 = rm.clone(), rv2 = rv.clone();
    const auto again = ops::batchnorm2d_train(cpu(), x, gamma, beta, rm2, rv2, p, false);
    EXPECT_TRUE(bitwise_equal(again.y, r.y));
    EXPECT_TRUE(bitwise_equal(again.invstd, r.invstd));
    EXPECT_TRUE(bitwise_equal(rm2, rm));
    EXPECT_TRUE(bitwise_equal(rv2, rv));
    // Undefined running statistics are fine when they are not updated.
    EXPECT_NO_THROW(ops::batchnorm2d_train(cpu(), x, gamma, beta, Tensor(), Tensor(), p, false));

    const Tensor dx = filled(x.shape(), std::nanf(""));
    const Tensor dg0 = random_tensor(gamma.shape(), 9), dg = dg0.clone();
    const Tensor db0 = random_tensor(beta.shape(), 10), db = db0.clone();
    cpu().batchnorm2d_backward(f.tensor("dy"), x, gamma, r.mean, r.invstd, dx, dg, db);
    // dx combines three per-channel sums and cancels them: atol 1e-5 on O(1) values holds.
    EXPECT_ALL_CLOSE(dx, f.tensor("dx"), kRtol, kAtol);
    EXPECT_ALL_CLOSE(dg, plus(dg0, f.tensor("dgamma")), kRtol, kAtol);
    EXPECT_ALL_CLOSE(db, plus(db0, f.tensor("dbeta")), kRtol, kAtol);
  }
}

TEST(CnnGolden, BatchNormEval) {
  const auto f = load_golden("cnn/bn_eval");
  BatchNormParams p;
  p.eps = static_cast<float>(meta_float(f, "eps"));
  const Tensor x = f.tensor("x");
  const Tensor y = Tensor::empty(x.shape());
  cpu().batchnorm2d_forward_eval(x, f.tensor("gamma"), f.tensor("beta"), f.tensor("running_mean"),
                                 f.tensor("running_var"), p, y);
  EXPECT_ALL_CLOSE(y, f.tensor("y"), kRtol, kAtol);
}

// ---- Finite differences (L = sum(dy * y)) -----------------------------------------------------

struct ConvCase {
  Shape x, w;
  Conv2dParams p;
  bool bias;
};

Conv2dParams make_conv(int sh, int sw, int ph, int pw, int dh, int dw, int groups) {
  Conv2dParams p;
  p.stride_h = sh, p.stride_w = sw, p.pad_h = ph, p.pad_w = pw, p.dilation_h = dh, p.dilation_w = dw;
  p.groups = groups;
  return p;
}

TEST(CnnGradCheck, Conv2d) {
  const std::vector<ConvCase> cases = {
      {Shape{2, 3, 7, 5}, Shape{4, 3, 3, 3}, make_conv(2, 1, 1, 1, 1, 1, 1), true},
      {Shape{2, 4, 8, 9}, Shape{6, 2, 3, 2}, make_conv(1, 2, 2, 0, 2, 1, 2), true},
      {Shape{1, 3, 6, 6}, Shape{3, 1, 3, 3}, make_conv(1, 1, 1, 1, 1, 1, 3), false},  // depthwise
      {Shape{3, 1, 40, 40}, Shape{2, 1, 3, 3}, make_conv(1, 1, 0, 0, 1, 1, 1), true},
  };
  ConvMode restore;
  uint32_t seed = 1;
  for (const PathMode& mode : kAllPathModes) {
    for (const auto& c : cases) {
      SCOPED_TRACE(c.x.str() + " * " + c.w.str() + " (" + mode.str() + ")");
      mode.apply();
      const Tensor x = random_tensor(c.x, seed++), w = random_tensor(c.w, seed++, -0.5f, 0.5f);
      const Tensor b = c.bias ? random_tensor(Shape{c.w[0]}, seed++) : Tensor();
      const Tensor dy = random_tensor(remat::conv2d_output_shape(c.x, c.w, c.p), seed++);
      const Tensor dw = Tensor::zeros(c.w), db = c.bias ? Tensor::zeros(Shape{c.w[0]}) : Tensor();
      const Tensor dx = ops::conv2d_backward(cpu(), dy, x, w, c.p, true, dw, db);
      auto loss = [&] { return dot(dy, ops::conv2d(cpu(), x, w, b, c.p)); };
      EXPECT_TRUE(check_gradient("conv2d dx", x, dx, loss));
      EXPECT_TRUE(check_gradient("conv2d dw", w, dw, loss));
      if (c.bias) {
        EXPECT_TRUE(check_gradient("conv2d db", b, db, loss));
      }
    }
  }
}

// Distinct values at least `gap` apart, shuffled: no ties, and a +-eps perturbation
// (eps < gap / 2) never changes which element is the maximum.
Tensor distinct_values(const Shape& s, uint32_t seed, float gap) {
  std::vector<float> v(static_cast<size_t>(s.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = gap * (static_cast<float>(i) - static_cast<float>(v.size()) / 2);
  std::mt19937 rng(seed);
  std::shuffle(v.begin(), v.end(), rng);
  return Tensor::from_vector(v, s);
}

TEST(CnnGradCheck, Pooling) {
  struct PoolCase {
    Shape x;
    Pool2dParams p;
  };
  auto pool = [](int kh, int kw, int sh, int sw, int ph, int pw) {
    Pool2dParams p;
    p.kernel_h = kh, p.kernel_w = kw, p.stride_h = sh, p.stride_w = sw, p.pad_h = ph, p.pad_w = pw;
    return p;
  };
  const std::vector<PoolCase> cases = {{Shape{2, 3, 8, 6}, pool(2, 2, 2, 2, 0, 0)},
                                       {Shape{2, 2, 7, 9}, pool(3, 3, 2, 2, 1, 1)},
                                       {Shape{1, 2, 5, 7}, pool(3, 2, 1, 2, 1, 1)}};
  uint32_t seed = 40;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.x.str());
    GradCheckOptions opt;
    opt.eps = 1e-2;
    const Tensor x = distinct_values(c.x, seed++, 0.05f);
    const auto r = ops::maxpool2d(cpu(), x, c.p);
    const Tensor dy = random_tensor(r.y.shape(), seed++);
    const Tensor dx = ops::empty_like(cpu(), x);
    cpu().maxpool2d_backward(dy, r.indices, c.p, dx);
    EXPECT_TRUE(check_gradient(
        "maxpool2d dx", x, dx, [&] { return dot(dy, ops::maxpool2d(cpu(), x, c.p).y); }, opt));

    const Tensor xa = random_tensor(c.x, seed++);
    const Tensor dya = random_tensor(r.y.shape(), seed++);
    const Tensor dxa = ops::empty_like(cpu(), xa);
    cpu().avgpool2d_backward(dya, c.p, dxa);
    EXPECT_TRUE(check_gradient("avgpool2d dx", xa, dxa, [&] { return dot(dya, ops::avgpool2d(cpu(), xa, c.p)); }));
  }
  const Tensor x = random_tensor(Shape{3, 4, 5, 3}, 50);
  const Tensor dy = random_tensor(Shape{3, 4}, 51);
  const Tensor dx = ops::empty_like(cpu(), x);
  cpu().global_avgpool_backward(dy, dx);
  EXPECT_TRUE(check_gradient("global_avgpool dx", x, dx, [&] { return dot(dy, ops::global_avgpool(cpu(), x)); }));
}

TEST(CnnGradCheck, BatchNorm) {
  for (const Shape& s : {Shape{4, 3, 5, 6}, Shape{2, 5, 3, 1}}) {
    SCOPED_TRACE(s.str());
    BatchNormParams p;
    const Tensor x = random_tensor(s, 60), gamma = random_tensor(Shape{s[1]}, 61, 0.5f, 1.5f);
    const Tensor beta = random_tensor(Shape{s[1]}, 62);
    const Tensor dy = random_tensor(s, 63);
    const auto r = ops::batchnorm2d_train(cpu(), x, gamma, beta, Tensor(), Tensor(), p, false);
    const Tensor dx = ops::empty_like(cpu(), x), dg = Tensor::zeros(gamma.shape()), db = Tensor::zeros(beta.shape());
    cpu().batchnorm2d_backward(dy, x, gamma, r.mean, r.invstd, dx, dg, db);
    auto loss = [&] { return dot(dy, ops::batchnorm2d_train(cpu(), x, gamma, beta, Tensor(), Tensor(), p, false).y); };
    // Normalisation is smooth: central differences with eps 1e-2 are accurate to O(eps^2).
    EXPECT_TRUE(check_gradient("batchnorm2d dx", x, dx, loss));
    EXPECT_TRUE(check_gradient("batchnorm2d dgamma", gamma, dg, loss));
    EXPECT_TRUE(check_gradient("batchnorm2d dbeta", beta, db, loss));
  }
}

// ---- Direct-loop reference for conv2d (independent of im2col and BLAS) ----------------------

struct Direct {
  Tensor y, dx, dw, db;
};

Direct direct_conv(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& dy, const Conv2dParams& p) {
  const Shape ys = remat::conv2d_output_shape(x.shape(), w.shape(), p);
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3);
  const int64_t k = w.size(0), cg = w.size(1), r = w.size(2), s = w.size(3), pp = ys[2], qq = ys[3];
  const int64_t kg = k / p.groups;
  const auto xv = x.to_vector(), wv = w.to_vector(), bv = b.to_vector(), gv = dy.to_vector();
  std::vector<double> y(static_cast<size_t>(ys.numel())), dx(xv.size()), dw(wv.size()), db(bv.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < k; ++o)
      for (int64_t a = 0; a < pp; ++a)
        for (int64_t e = 0; e < qq; ++e) {
          const size_t yi = static_cast<size_t>(((i * k + o) * pp + a) * qq + e);
          double acc = bv[static_cast<size_t>(o)];
          db[static_cast<size_t>(o)] += gv[yi];
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t u = 0; u < r; ++u)
              for (int64_t v = 0; v < s; ++v) {
                const int64_t hh = a * p.stride_h - p.pad_h + u * p.dilation_h;
                const int64_t ww = e * p.stride_w - p.pad_w + v * p.dilation_w;
                if (hh < 0 || hh >= h || ww < 0 || ww >= wd) continue;
                const int64_t ch = (o / kg) * cg + ci;
                const size_t xi = static_cast<size_t>(((i * c + ch) * h + hh) * wd + ww);
                const size_t wi = static_cast<size_t>(((o * cg + ci) * r + u) * s + v);
                acc += static_cast<double>(xv[xi]) * wv[wi];
                dx[xi] += static_cast<double>(gv[yi]) * wv[wi];
                dw[wi] += static_cast<double>(gv[yi]) * xv[xi];
              }
          y[yi] = acc;
        }
  auto to_tensor = [](const std::vector<double>& v, const Shape& sh) {
    return Tensor::from_vector(std::vector<float>(v.begin(), v.end()), sh);
  };
  return {to_tensor(y, ys), to_tensor(dx, x.shape()), to_tensor(dw, w.shape()), to_tensor(db, b.shape())};
}

TEST(CnnReference, Conv2dMatchesDirectLoops) {
  // Groups, stride, padding and dilation together, on every path.
  const std::vector<ConvCase> cases = {
      {Shape{7, 4, 30, 30}, Shape{6, 2, 3, 3}, make_conv(1, 1, 1, 1, 1, 1, 2), true},
      {Shape{5, 3, 41, 37}, Shape{4, 3, 3, 2}, make_conv(1, 2, 2, 1, 2, 1, 1), true},
      {Shape{9, 2, 12, 12}, Shape{4, 2, 5, 5}, make_conv(2, 2, 2, 2, 1, 1, 1), true},
  };
  ConvMode restore;
  uint32_t seed = 70;
  for (const PathMode& mode : kAllPathModes) {
    for (const auto& c : cases) {
      SCOPED_TRACE(c.x.str() + " * " + c.w.str() + " (" + mode.str() + ")");
      mode.apply();
      const Tensor x = random_tensor(c.x, seed++), w = random_tensor(c.w, seed++, -0.5f, 0.5f);
      const Tensor b = random_tensor(Shape{c.w[0]}, seed++);
      const Tensor dy = random_tensor(remat::conv2d_output_shape(c.x, c.w, c.p), seed++);
      const Direct ref = direct_conv(x, w, b, dy, c.p);
      EXPECT_ALL_CLOSE(ops::conv2d(cpu(), x, w, b, c.p), ref.y, kRtol, kAtol);
      const Tensor dw = Tensor::zeros(c.w), db = Tensor::zeros(Shape{c.w[0]});
      const Tensor dx = ops::conv2d_backward(cpu(), dy, x, w, c.p, true, dw, db);
      EXPECT_ALL_CLOSE(dx, ref.dx, kRtol, kAtol);
      // dw and db sum over every output position (hundreds to thousands of terms).
      EXPECT_ALL_CLOSE(dw, ref.dw, kRtol, 1e-4);
      EXPECT_ALL_CLOSE(db, ref.db, kRtol, 1e-4);
    }
  }
}

// ---- Pooling details --------------------------------------------------------------------------

TEST(CnnPool, MaxPoolTiesPaddingAndNaN) {
  Pool2dParams p;
  p.kernel_h = p.kernel_w = 2;
  p.stride_h = p.stride_w = 1;
  // Ties: the first maximum in scan order (row by row) wins.
  const Tensor x = Tensor::from_vector({1, 3, 3, 3, 2, 1}, Shape{1, 1, 2, 3});
  const auto r = ops::maxpool2d(cpu(), x, p);
  EXPECT_EQ(r.y.to_vector(), (std::vector<float>{3, 3}));
  EXPECT_EQ(r.indices.to_ints(), (std::vector<int32_t>{1, 0}));  // window offsets of position 1
  // Padding never wins, even over negative inputs.
  p.kernel_h = p.kernel_w = 3;
  p.pad_h = p.pad_w = 1;
  const Tensor neg = Tensor::from_vector({-5, -4, -3, -2}, Shape{1, 1, 2, 2});
  const auto rn = ops::maxpool2d(cpu(), neg, p);
  EXPECT_EQ(rn.y.to_vector(), (std::vector<float>{-2, -2, -2, -2}));
  EXPECT_EQ(flat_positions(rn.indices, neg.shape(), p), (std::vector<int32_t>{3, 3, 3, 3}));
  // NaN wins, the last one in scan order; all -inf picks the window's first input element
  // (both as PyTorch 1.13's max_pool2d).
  p.kernel_h = p.kernel_w = 2;
  p.pad_h = p.pad_w = 0;
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  const auto rnan = ops::maxpool2d(cpu(), Tensor::from_vector({1, nan, 3, nan, 2, 5}, Shape{1, 1, 2, 3}), p);
  EXPECT_TRUE(std::isnan(rnan.y.to_vector()[0]) && std::isnan(rnan.y.to_vector()[1]));
  EXPECT_EQ(rnan.indices.to_ints(), (std::vector<int32_t>{2, 0}));  // positions 3 and 1
  p.kernel_h = p.kernel_w = 3;
  p.pad_h = p.pad_w = 1;
  const auto rinf = ops::maxpool2d(cpu(), filled(Shape{1, 1, 2, 2}, -inf), p);
  EXPECT_EQ(rinf.y.to_vector(), (std::vector<float>(4, -inf)));
  EXPECT_EQ(flat_positions(rinf.indices, Shape{1, 1, 2, 2}, p), (std::vector<int32_t>{0, 0, 0, 0}));
  // Backward gathers every window's gradient at its maximum.
  const Tensor dy = Tensor::from_vector({1, 2, 3, 4}, Shape{1, 1, 2, 2});
  const Tensor dx = filled(neg.shape(), 99.0f);
  cpu().maxpool2d_backward(dy, rn.indices, p, dx);
  EXPECT_EQ(dx.to_vector(), (std::vector<float>{0, 0, 0, 10}));
}

// 2 x 2 windows of stride 2 (a vectorised path): ties, NaNs, infinities, widths that are
// odd (the last column dropped), below and above a vector of outputs, against the rule
// written out: the first maximum in scan order, or the window's last NaN.
TEST(CnnPool, MaxPool2x2Stride2MatchesTheRule) {
  Pool2dParams p;
  p.kernel_h = p.kernel_w = 2;
  p.stride_h = p.stride_w = 2;
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(5);
  for (const Shape& s : {Shape{1, 1, 2, 2}, Shape{2, 3, 9, 7}, Shape{2, 2, 10, 37}, Shape{1, 2, 4, 64}}) {
    SCOPED_TRACE(s.str());
    std::vector<float> v(static_cast<size_t>(s.numel()));
    const float pool[] = {-inf, -2.0f, -1.0f, 0.0f, 1.0f, 2.0f, inf, nan};
    for (auto& e : v) e = pool[rng() % 8];
    const auto r = ops::maxpool2d(cpu(), Tensor::from_vector(v, s), p);
    const auto y = r.y.to_vector();
    const auto idx = flat_positions(r.indices, s, p);
    const int64_t h = s[2], w = s[3], ph = h / 2, pw = w / 2;
    for (int64_t pl = 0; pl < s[0] * s[1]; ++pl)
      for (int64_t i = 0; i < ph; ++i)
        for (int64_t j = 0; j < pw; ++j) {
          int64_t best = 2 * i * w + 2 * j;
          for (int64_t a = 0; a < 2; ++a)
            for (int64_t b = 0; b < 2; ++b) {
              const int64_t at = (2 * i + a) * w + 2 * j + b;
              const float e = v[static_cast<size_t>(pl * h * w + at)], cur = v[static_cast<size_t>(pl * h * w + best)];
              if (std::isnan(e) || (!std::isnan(cur) && e > cur)) best = at;
            }
          const size_t o = static_cast<size_t>((pl * ph + i) * pw + j);
          ASSERT_EQ(idx[o], best) << "plane " << pl << " output (" << i << ", " << j << ")";
          const float want = v[static_cast<size_t>(pl * h * w + best)];
          EXPECT_TRUE(std::isnan(want) ? std::isnan(y[o]) : y[o] == want);
        }
  }
}

// The saved index is the offset r * kernel_w + c of the maximum within its window, from the
// window's top-left corner in padded coordinates; overlapping windows (stride < kernel)
// that share a maximum name it by different offsets, and backward adds both gradients.
TEST(CnnPool, MaxPoolIndexIsTheWindowOffset) {
  Pool2dParams p;
  p.kernel_h = p.kernel_w = 3;
  p.stride_h = p.stride_w = 2;
  p.pad_h = p.pad_w = 1;
  const Tensor x = Tensor::from_vector({1, 5, 2, 0,  //
                                        3, 4, 9, 6,  //
                                        7, 8, 0, 1},
                                       Shape{1, 1, 3, 4});
  const auto r = ops::maxpool2d(cpu(), x, p);
  EXPECT_EQ(r.indices.dtype(), DType::u8);
  EXPECT_EQ(r.y.to_vector(), (std::vector<float>{5, 9, 8, 9}));
  // Windows at padded (-1, -1), (-1, 1), (1, -1), (1, 1): the maxima (0, 1), (1, 2), (2, 1)
  // and (1, 2) again.
  EXPECT_EQ(r.indices.to_ints(), (std::vector<int32_t>{5, 7, 5, 1}));
  const Tensor dx = filled(x.shape(), 99.0f);
  cpu().maxpool2d_backward(Tensor::from_vector({1, 2, 3, 4}, Shape{1, 1, 2, 2}), r.indices, p, dx);
  EXPECT_EQ(dx.to_vector(), (std::vector<float>{0, 1, 0, 0, 0, 0, 6, 0, 0, 3, 0, 0}));

  // A 2 x 3 window (offsets r * 3 + c), stride 1 x 2, padding 1 x 1.
  p.kernel_h = 2, p.stride_h = 1;
  const auto r2 = ops::maxpool2d(cpu(), Tensor::from_vector({1, 2, 3, 6, 5, 4}, Shape{1, 1, 2, 3}), p);
  EXPECT_EQ(r2.y.to_vector(), (std::vector<float>{2, 3, 6, 5, 6, 5}));
  EXPECT_EQ(r2.indices.to_ints(), (std::vector<int32_t>{5, 4, 4, 3, 1, 0}));
}

// Backward against a direct loop: every window scanned for its first maximum, its gradient
// added there, the outputs in order (the same float sums): bitwise, windows of up to 256.
TEST(CnnPool, MaxPoolBackwardMatchesADirectLoop) {
  struct PoolCase {
    Shape x;
    int kh, kw, sh, sw, ph, pw;
  };
  uint32_t seed = 70;
  for (const PoolCase& c :
       {PoolCase{Shape{2, 3, 8, 6}, 2, 2, 2, 2, 0, 0}, PoolCase{Shape{2, 2, 9, 7}, 3, 3, 2, 2, 1, 1},
        PoolCase{Shape{1, 3, 7, 9}, 3, 2, 1, 2, 1, 1}, PoolCase{Shape{1, 2, 6, 5}, 4, 4, 1, 1, 2, 2},
        PoolCase{Shape{1, 2, 20, 18}, 16, 16, 3, 2, 8, 8}}) {
    SCOPED_TRACE(c.x.str() + " k" + std::to_string(c.kh) + "x" + std::to_string(c.kw));
    Pool2dParams p;
    p.kernel_h = c.kh, p.kernel_w = c.kw, p.stride_h = c.sh, p.stride_w = c.sw, p.pad_h = c.ph, p.pad_w = c.pw;
    // Few distinct values: many ties and shared maxima.
    std::vector<float> v(static_cast<size_t>(c.x.numel()));
    std::mt19937 rng(seed++);
    for (auto& e : v) e = static_cast<float>(rng() % 5);
    const auto r = ops::maxpool2d(cpu(), Tensor::from_vector(v, c.x), p);
    const Tensor dy = random_tensor(r.y.shape(), seed++);
    const Tensor dx = filled(c.x, std::nanf(""));
    cpu().maxpool2d_backward(dy, r.indices, p, dx);

    const int64_t h = c.x[2], w = c.x[3], P = r.y.size(2), Q = r.y.size(3);
    const auto g = dy.to_vector();
    const auto off = r.indices.to_ints();
    std::vector<float> want(v.size(), 0.0f);
    for (int64_t pl = 0; pl < c.x[0] * c.x[1]; ++pl)
      for (int64_t pp = 0; pp < P; ++pp)
        for (int64_t qq = 0; qq < Q; ++qq) {
          const int64_t h0 = pp * c.sh - c.ph, w0 = qq * c.sw - c.pw;
          int64_t best = -1;
          for (int64_t a = 0; a < c.kh; ++a)
            for (int64_t b = 0; b < c.kw; ++b) {
              const int64_t hh = h0 + a, ww = w0 + b;
              if (hh < 0 || hh >= h || ww < 0 || ww >= w) continue;
              if (best < 0 ||
                  v[static_cast<size_t>(pl * h * w + hh * w + ww)] > v[static_cast<size_t>(pl * h * w + best)])
                best = hh * w + ww;
            }
          const size_t o = static_cast<size_t>((pl * P + pp) * Q + qq);
          ASSERT_EQ(off[o], (best / w - h0) * c.kw + (best % w - w0)) << "output " << o;
          want[static_cast<size_t>(pl * h * w + best)] += g[o];
        }
    EXPECT_TRUE(bitwise_equal(dx, Tensor::from_vector(want, c.x)));
  }
}

// kernel_h * kernel_w above 256 does not fit a one-byte offset: both validators say so.
TEST(CnnPool, MaxPoolRejectsWindowsOver256) {
  Pool2dParams p;
  p.kernel_h = p.kernel_w = 17;
  const Tensor x = Tensor::zeros(Shape{1, 1, 20, 20});
  EXPECT_REMAT_ERROR(ops::maxpool2d(cpu(), x, p),
                     "maxpool2d_forward: kernel 17x17 has 289 positions; at most 256 (the saved index is one byte");
  EXPECT_REMAT_ERROR(
      cpu().maxpool2d_backward(Tensor::zeros(Shape{1, 1, 2, 2}),
                               Tensor::empty(Shape{1, 1, 2, 2}, Device::cpu(), DType::u8), p, Tensor::empty(x.shape())),
      "maxpool2d_backward: kernel 17x17 has 289 positions");
  p.kernel_w = 15;  // 255 positions
  EXPECT_EQ(ops::maxpool2d(cpu(), x, p).indices.dtype(), DType::u8);
}

TEST(CnnPool, MaxPoolBackwardRejectsBadIndices) {
  Pool2dParams p;  // 2 x 2, stride 2
  const Tensor dy = Tensor::from_vector({1, 2}, Shape{1, 1, 1, 2});
  const Tensor dx = Tensor::empty(Shape{1, 1, 2, 4});
  // Offset 4 is outside a 2 x 2 window.
  EXPECT_REMAT_ERROR(cpu().maxpool2d_backward(dy, Tensor::from_u8({0, 4}, Shape{1, 1, 1, 2}), p, dx),
                     "maxpool2d_backward: indices u8[1, 1, 1, 2] on cpu hold 4 at flat position 1");
  // Offset 0 of a padded 3 x 3 window is padding.
  p.kernel_h = p.kernel_w = 3;
  p.stride_h = p.stride_w = 1;
  p.pad_h = p.pad_w = 1;
  EXPECT_REMAT_ERROR(cpu().maxpool2d_backward(Tensor::zeros(Shape{1, 1, 2, 4}),
                                              Tensor::from_u8(std::vector<uint8_t>(8, 0), Shape{1, 1, 2, 4}), p, dx),
                     "maxpool2d_backward: indices u8[1, 1, 2, 4] on cpu hold 0 at flat position 0");
  // dy must be the pool of dx.
  EXPECT_REMAT_ERROR(cpu().maxpool2d_backward(dy, Tensor::from_u8({0, 0}, Shape{1, 1, 1, 2}), p, dx),
                     "maxpool2d_backward: dy f32[1, 1, 1, 2] on cpu: expected shape [1, 1, 2, 4]");
}

// ---- Determinism ------------------------------------------------------------------------------

struct ConvRun {
  Tensor y, dx, dw, db;
};

ConvRun run_conv(const ConvCase& c) {
  const Tensor x = random_tensor(c.x, 80), w = random_tensor(c.w, 81, -0.5f, 0.5f);
  const Tensor b = c.bias ? random_tensor(Shape{c.w[0]}, 82) : Tensor();
  ConvRun r;
  r.y = ops::conv2d(cpu(), x, w, b, c.p);
  const Tensor dy = random_tensor(r.y.shape(), 83);
  r.dw = random_tensor(c.w, 84);  // accumulation onto non-zero values
  r.db = c.bias ? random_tensor(Shape{c.w[0]}, 85) : Tensor();
  r.dx = ops::conv2d_backward(cpu(), dy, x, w, c.p, true, r.dw, r.db);
  return r;
}

struct BnRun {
  Tensor y, mean, invstd, rm, rv, dx, dg, db;
};

BnRun run_bn(const Shape& s) {
  const Tensor x = random_tensor(s, 90, -2.0f, 3.0f), gamma = random_tensor(Shape{s[1]}, 91);
  const Tensor beta = random_tensor(Shape{s[1]}, 92);
  BnRun r;
  r.rm = random_tensor(Shape{s[1]}, 93);
  r.rv = random_tensor(Shape{s[1]}, 94, 0.5f, 1.5f);
  const auto f = ops::batchnorm2d_train(cpu(), x, gamma, beta, r.rm, r.rv, BatchNormParams{}, true);
  r.y = f.y, r.mean = f.mean, r.invstd = f.invstd;
  const Tensor dy = random_tensor(s, 95);
  r.dx = ops::empty_like(cpu(), x);
  r.dg = random_tensor(Shape{s[1]}, 96);
  r.db = random_tensor(Shape{s[1]}, 97);
  cpu().batchnorm2d_backward(dy, x, gamma, f.mean, f.invstd, r.dx, r.dg, r.db);
  return r;
}

struct PoolRun {
  Tensor ymax, idx, dxmax, yavg, dxavg, ygap, dxgap;
};

PoolRun run_pools(const Shape& s) {
  Pool2dParams p;
  p.kernel_h = p.kernel_w = 3;
  p.pad_h = p.pad_w = 1;
  const Tensor x = random_tensor(s, 100);
  PoolRun r;
  const auto m = ops::maxpool2d(cpu(), x, p);
  r.ymax = m.y, r.idx = m.indices;
  const Tensor dy = random_tensor(m.y.shape(), 101);
  r.dxmax = ops::empty_like(cpu(), x);
  cpu().maxpool2d_backward(dy, m.indices, p, r.dxmax);
  r.yavg = ops::avgpool2d(cpu(), x, p);
  r.dxavg = ops::empty_like(cpu(), x);
  cpu().avgpool2d_backward(dy, p, r.dxavg);
  r.ygap = ops::global_avgpool(cpu(), x);
  r.dxgap = ops::empty_like(cpu(), x);
  cpu().global_avgpool_backward(random_tensor(r.ygap.shape(), 102), r.dxgap);
  return r;
}

void expect_same(const ConvRun& a, const ConvRun& b) {
  EXPECT_TRUE(bitwise_equal(a.y, b.y));
  EXPECT_TRUE(bitwise_equal(a.dx, b.dx));
  EXPECT_TRUE(bitwise_equal(a.dw, b.dw));
  ASSERT_EQ(a.db.defined(), b.db.defined());
  if (a.db.defined()) {
    EXPECT_TRUE(bitwise_equal(a.db, b.db));
  }
}

void expect_same(const BnRun& a, const BnRun& b) {
  for (auto m : {&BnRun::y, &BnRun::mean, &BnRun::invstd, &BnRun::rm, &BnRun::rv, &BnRun::dx, &BnRun::dg, &BnRun::db})
    EXPECT_TRUE(bitwise_equal(a.*m, b.*m));
}

void expect_same(const PoolRun& a, const PoolRun& b) {
  for (auto m : {&PoolRun::ymax, &PoolRun::idx, &PoolRun::dxmax, &PoolRun::yavg, &PoolRun::dxavg, &PoolRun::ygap,
                 &PoolRun::dxgap})
    EXPECT_TRUE(bitwise_equal(a.*m, b.*m));
}

// Large enough that every parallel loop has work for several threads; conv2d with groups,
// stride 1 and stride 2 (dx by col2im), on the paths chosen and forced, in several chunks.
const std::vector<ConvCase> kDetConvs = {
    {Shape{5, 8, 40, 40}, Shape{12, 4, 3, 3}, make_conv(1, 1, 1, 1, 1, 1, 2), true},
    {Shape{5, 8, 40, 40}, Shape{12, 4, 3, 3}, make_conv(2, 2, 1, 1, 1, 1, 2), true},
};
const Shape kDetBn{8, 6, 40, 37};
const Shape kDetPool{4, 6, 41, 37};

std::vector<ConvRun> run_det_convs() {
  std::vector<ConvRun> out;
  for (const PathMode& mode : {PathMode{ConvPath::automatic, 0}, PathMode{ConvPath::automatic, 2},
                               PathMode{ConvPath::implicit, 2}, PathMode{ConvPath::direct, 2}}) {
    mode.apply();
    for (const auto& c : kDetConvs) out.push_back(run_conv(c));
  }
  return out;
}

void expect_same(const std::vector<ConvRun>& a, const std::vector<ConvRun>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE("conv run " + std::to_string(i));
    expect_same(a[i], b[i]);
  }
}

TEST(CnnDeterminism, RunToRunBitwiseEqual) {
  ConvMode restore;
  expect_same(run_det_convs(), run_det_convs());
  expect_same(run_bn(kDetBn), run_bn(kDetBn));
  expect_same(run_pools(kDetPool), run_pools(kDetPool));
}

// Any thread count gives the same bits: every output is computed by one thread in a fixed
// order (conv2d's GEMM included; it does not use a BLAS thread pool).
TEST(CnnDeterminism, ThreadCountDoesNotChangeResults) {
  ConvMode restore_conv;
  ThreadCount restore;
  omp_set_num_threads(1);
  const auto c1 = run_det_convs();
  const BnRun b1 = run_bn(kDetBn);
  const PoolRun p1 = run_pools(kDetPool);
  for (int threads : {2, 3}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    omp_set_num_threads(threads);
    expect_same(c1, run_det_convs());
    expect_same(b1, run_bn(kDetBn));
    expect_same(p1, run_pools(kDetPool));
  }
}

// ---- The conv2d paths and the micro-kernels ------------------------------------------------

// Stride-1 shapes where the implicit and direct paths apply (for y and dw; for dx too
// except where the padding exceeds the dilated kernel's reach, as with the padded 1x1
// convolution).
const std::vector<ConvCase> kImplicitCases = {
    {Shape{5, 8, 40, 40}, Shape{12, 4, 3, 3}, make_conv(1, 1, 1, 1, 1, 1, 2), true},
    {Shape{3, 4, 20, 24}, Shape{6, 2, 3, 3}, make_conv(1, 1, 2, 2, 2, 2, 2), true},   // dilation 2
    {Shape{2, 3, 20, 20}, Shape{4, 3, 1, 1}, make_conv(1, 1, 1, 1, 1, 1, 1), false},  // dx explicit
    {Shape{2, 3, 17, 19}, Shape{40, 3, 5, 3}, make_conv(1, 1, 2, 1, 1, 1, 1), true},  // K > NR, odd sizes
    {Shape{4, 6, 18, 18}, Shape{6, 1, 3, 3}, make_conv(1, 1, 1, 1, 1, 1, 6), false},  // depthwise
};

TEST(CnnPaths, GemmFeedsAgree) {
  ConvMode restore;
  // The same chunks for every path (dw accumulates chunk by chunk).
  remat::cpu_conv::set_chunk_images(2);
  for (const auto& c : kImplicitCases) {
    SCOPED_TRACE(c.x.str() + " * " + c.w.str());
    auto run = [&](ConvPath path, size_t* ws) {
      remat::cpu_conv::set_path(path);
      *ws = cpu().conv2d_forward_workspace(c.x, c.w, c.p);
      return run_conv(c);
    };
    size_t ws_expl = 0, ws_implicit = 0, ws_direct = 0;
    const ConvRun expl = run(ConvPath::im2col, &ws_expl);
    const ConvRun implicit = run(ConvPath::implicit, &ws_implicit);
    const ConvRun direct = run(ConvPath::direct, &ws_direct);
    EXPECT_NE(ws_implicit, ws_expl) << "the implicit path was not taken";
    EXPECT_NE(ws_direct, ws_expl) << "the direct path was not taken";
    EXPECT_NE(ws_direct, ws_implicit) << "the direct path was not taken";
    // The same products summed in the same order: y and dw are bitwise equal (the dropped
    // columns of the padded width add exact zeros to dw).
    for (const ConvRun* other : {&implicit, &direct}) {
      EXPECT_TRUE(bitwise_equal(other->y, expl.y));
      EXPECT_TRUE(bitwise_equal(other->dw, expl.dw));
      if (c.bias) {
        EXPECT_TRUE(bitwise_equal(other->db, expl.db));
      }
      // col2im sums each (r, s) separately, the implicit and direct dx in one chain:
      // rounding differs.
      EXPECT_ALL_CLOSE(other->dx, expl.dx, kRtol, kAtol);
    }
    // Where both take dx over the padded dy, they sum it in the same order.
    EXPECT_TRUE(bitwise_equal(direct.dx, implicit.dx));
  }
}

// The workspace as the ops get it may hold anything: filled with NaN, and with a NaN
// canary region after the bytes the query asked for, results are unchanged (no output
// reads workspace that was not written) and the canary is untouched (no write past the
// query's size).
TEST(CnnPaths, WorkspaceIsExactlyWhatIsUsed) {
  ConvMode restore;
  constexpr int64_t kCanary = 1024;
  auto nan_workspace = [](size_t bytes) {
    return Tensor::full(Shape{static_cast<int64_t>(bytes / sizeof(float)) + kCanary}, std::nanf(""));
  };
  auto canary_intact = [](const Tensor& ws, size_t bytes) {
    const auto v = ws.to_vector();
    for (size_t i = bytes / sizeof(float); i < v.size(); ++i)
      if (!std::isnan(v[i])) return ::testing::AssertionFailure() << "workspace float " << i << " written";
    return ::testing::AssertionSuccess();
  };
  std::vector<ConvCase> cases = kImplicitCases;
  cases.push_back({Shape{3, 3, 7, 5}, Shape{6, 1, 3, 3}, make_conv(2, 1, 1, 1, 1, 2, 3), true});  // explicit
  for (const PathMode& mode : kAllPathModes) {
    mode.apply();
    for (const auto& c : cases) {
      SCOPED_TRACE(c.x.str() + " * " + c.w.str() + " (" + mode.str() + ")");
      const ConvRun ref = run_conv(c);
      const Tensor x = random_tensor(c.x, 80), w = random_tensor(c.w, 81, -0.5f, 0.5f);
      const Tensor b = c.bias ? random_tensor(Shape{c.w[0]}, 82) : Tensor();
      const size_t fwd = cpu().conv2d_forward_workspace(c.x, c.w, c.p);
      ASSERT_EQ(fwd % sizeof(float), 0u);
      const Tensor wsf = nan_workspace(fwd), y = Tensor::empty(ref.y.shape());
      cpu().conv2d_forward(x, w, b, c.p, y, wsf);
      EXPECT_TRUE(bitwise_equal(y, ref.y));
      EXPECT_TRUE(canary_intact(wsf, fwd));

      const Tensor dy = random_tensor(ref.y.shape(), 83);
      const Tensor dw = random_tensor(c.w, 84), db = c.bias ? random_tensor(Shape{c.w[0]}, 85) : Tensor();
      const Tensor dx = filled(c.x, std::nanf(""));
      const size_t bwd = cpu().conv2d_backward_workspace(c.x, c.w, c.p);
      ASSERT_EQ(bwd % sizeof(float), 0u);
      const Tensor wsb = nan_workspace(bwd);
      cpu().conv2d_backward(dy, x, w, c.p, dx, dw, db, wsb);
      EXPECT_TRUE(bitwise_equal(dx, ref.dx));
      EXPECT_TRUE(bitwise_equal(dw, ref.dw));
      EXPECT_TRUE(canary_intact(wsb, bwd));
    }
  }
}

TEST(CnnPaths, MicroKernelsAgreeBitwise) {
  ConvMode restore;
  const auto kernels = remat::cpu_conv::available_micro_kernels();
  ASSERT_FALSE(kernels.empty());
  EXPECT_EQ(kernels.back(), "portable");
  EXPECT_EQ(remat::cpu_conv::micro_kernel(), kernels.front());  // the best one by default
  EXPECT_REMAT_ERROR(remat::cpu_conv::use_micro_kernel("sse9"), "micro-kernel \"sse9\"");
  std::vector<ConvCase> cases = kImplicitCases;
  cases.push_back({Shape{3, 3, 7, 5}, Shape{5, 3, 3, 3}, make_conv(2, 2, 1, 1, 1, 1, 1), true});  // explicit
  for (const PathMode& mode : kAllPathModes) {
    mode.apply();
    for (const auto& c : cases) {
      SCOPED_TRACE(c.x.str() + " * " + c.w.str() + " (" + mode.str() + ")");
      remat::cpu_conv::use_micro_kernel(kernels.front());
      const ConvRun ref = run_conv(c);
      for (size_t i = 1; i < kernels.size(); ++i) {
        SCOPED_TRACE(kernels[i] + " vs " + kernels.front());
        remat::cpu_conv::use_micro_kernel(kernels[i]);
        expect_same(ref, run_conv(c));
      }
    }
  }
}

// ---- Errors -------------------------------------------------------------------------------------

TEST(CnnErrors, Conv2dNamesOpAndShapes) {
  Backend& be = cpu();
  const Conv2dParams p;
  const Tensor x = Tensor::zeros(Shape{2, 3, 8, 8}), w = Tensor::zeros(Shape{4, 3, 3, 3});
  const Tensor y = Tensor::empty(Shape{2, 4, 6, 6});
  const Tensor ws = ops::workspace(be, be.conv2d_forward_workspace(x.shape(), w.shape(), p));
  // Channel mismatch.
  EXPECT_REMAT_ERROR(be.conv2d_forward(x, Tensor::zeros(Shape{4, 2, 3, 3}), Tensor(), p, y, ws),
                     "conv2d_forward: x [2, 3, 8, 8] has 3 channels but w [4, 2, 3, 3] expects 2");
  // Wrong rank.
  EXPECT_REMAT_ERROR(be.conv2d_forward(Tensor::zeros(Shape{3, 8, 8}), w, Tensor(), p, y, ws),
                     "conv2d_forward: x [3, 8, 8]: expected rank 4");
  EXPECT_REMAT_ERROR(be.conv2d_forward(x, Tensor::zeros(Shape{4, 3, 3}), Tensor(), p, y, ws),
                     "conv2d_forward: w [4, 3, 3]: expected rank 4");
  // Kernel larger than the padded input.
  EXPECT_REMAT_ERROR(ops::conv2d(be, Tensor::zeros(Shape{1, 3, 2, 8}), w, Tensor(), p),
                     "larger than the padded input [1, 3, 2, 8]");
  // Groups that do not divide the channels.
  Conv2dParams g2;
  g2.groups = 2;
  EXPECT_REMAT_ERROR(be.conv2d_forward_workspace(Shape{2, 3, 8, 8}, Shape{4, 1, 3, 3}, g2),
                     "conv2d_forward: x [2, 3, 8, 8] and w [4, 1, 3, 3]: channels must divide by groups 2");
  // Wrong dtype.
  const Tensor xi = Tensor::empty(Shape{2, 3, 8, 8}, Device::cpu(), DType::i32);
  EXPECT_REMAT_ERROR(be.conv2d_forward(xi, w, Tensor(), p, y, ws),
                     "conv2d_forward: x i32[2, 3, 8, 8] on cpu: expected dtype f32");
  // Output of the wrong shape, bias of the wrong size.
  EXPECT_REMAT_ERROR(be.conv2d_forward(x, w, Tensor(), p, Tensor::empty(Shape{2, 4, 6, 5}), ws),
                     "conv2d_forward: y f32[2, 4, 6, 5] on cpu: expected shape [2, 4, 6, 6]");
  EXPECT_REMAT_ERROR(be.conv2d_forward(x, w, Tensor::zeros(Shape{3}), p, y, ws), "conv2d_forward: b f32[3] on cpu");
  // Workspace too small, or none.
  const size_t need = be.conv2d_forward_workspace(x.shape(), w.shape(), p);
  ASSERT_GT(need, 1024u);
  const Tensor small = ops::workspace(be, need / 2);
  EXPECT_REMAT_ERROR(
      be.conv2d_forward(x, w, Tensor(), p, y, small),
      "conv2d_forward: workspace of " + std::to_string(need) + " bytes needed, got " + std::to_string(small.nbytes()));
  EXPECT_REMAT_ERROR(be.conv2d_backward(y, x, w, p, Tensor(), Tensor::zeros(w.shape()), Tensor(), Tensor()),
                     "conv2d_backward: workspace of");
  // Backward: dy of the wrong shape.
  EXPECT_REMAT_ERROR(be.conv2d_backward(Tensor::zeros(Shape{2, 4, 6, 7}), x, w, p, Tensor(), Tensor(), Tensor(), ws),
                     "conv2d_backward: dy f32[2, 4, 6, 7] on cpu: expected shape [2, 4, 6, 6]");
}

TEST(CnnErrors, PoolingAndBatchNorm) {
  Backend& be = cpu();
  Pool2dParams p;
  EXPECT_REMAT_ERROR(ops::maxpool2d(be, Tensor::zeros(Shape{3, 8, 8}), p), "expected rank 4");
  p.kernel_h = p.kernel_w = 5;
  EXPECT_REMAT_ERROR(ops::avgpool2d(be, Tensor::zeros(Shape{1, 1, 4, 8}), p),
                     "kernel 5x5 is larger than the padded input [1, 1, 4, 8]");
  const Tensor xi = Tensor::empty(Shape{1, 2, 4, 4}, Device::cpu(), DType::i32);
  p.kernel_h = p.kernel_w = 2;
  EXPECT_REMAT_ERROR(be.maxpool2d_forward(xi, p, Tensor::empty(Shape{1, 2, 2, 2}),
                                          Tensor::empty(Shape{1, 2, 2, 2}, Device::cpu(), DType::u8)),
                     "maxpool2d_forward: x i32[1, 2, 4, 4] on cpu: expected dtype f32");
  EXPECT_REMAT_ERROR(be.global_avgpool_forward(Tensor::zeros(Shape{2, 3, 4, 4}), Tensor::empty(Shape{2, 4})),
                     "global_avgpool_forward: y f32[2, 4] on cpu: expected shape [2, 3]");

  const Tensor x = Tensor::zeros(Shape{2, 3, 4, 4}), c3 = Tensor::zeros(Shape{3}), c4 = Tensor::zeros(Shape{4});
  EXPECT_REMAT_ERROR(ops::batchnorm2d_train(be, x, c4, c3, c3, c3, BatchNormParams{}),
                     "batchnorm2d_forward_train: gamma f32[4] on cpu: expected shape [3]");
  EXPECT_REMAT_ERROR(
      be.batchnorm2d_forward_eval(xi, c3, c3, c3, c3, BatchNormParams{}, Tensor::empty(Shape{1, 2, 4, 4})),
      "batchnorm2d_forward_eval: x i32[1, 2, 4, 4] on cpu: expected dtype f32");
  EXPECT_REMAT_ERROR(ops::batchnorm2d_train(be, Tensor::zeros(Shape{1, 3, 1, 1}), c3, c3, c3, c3, BatchNormParams{}),
                     "batch statistics need more than one value per channel");
}

// ---- Meta backend: the same allocations as cpu ---------------------------------------------------

struct Footprint {
  int64_t peak = 0, held = 0;
  size_t ws_fwd = 0, ws_bwd = 0;
};

Footprint conv_footprint(Backend& be, const ConvCase& c) {
  const Device d = be.device();
  auto& alloc = remat::allocator_for(d);
  const Tensor x = d.is_cpu() ? random_tensor(c.x, 110) : Tensor::empty(c.x, d);
  const Tensor w = d.is_cpu() ? random_tensor(c.w, 111) : Tensor::empty(c.w, d);
  const Tensor b = Tensor::zeros(Shape{c.w[0]}, d);
  const Tensor dw = Tensor::zeros(c.w, d), db = Tensor::zeros(Shape{c.w[0]}, d);
  const int64_t base = alloc.stats().allocated;
  alloc.reset_peak();
  Footprint f;
  {
    const Tensor y = ops::conv2d(be, x, w, b, c.p);
    const Tensor dx = ops::conv2d_backward(be, y, x, w, c.p, true, dw, db);  // y stands in for dy
    f.held = alloc.stats().allocated - base;
  }
  f.peak = alloc.stats().peak_allocated - base;
  f.ws_fwd = be.conv2d_forward_workspace(c.x, c.w, c.p);
  f.ws_bwd = be.conv2d_backward_workspace(c.x, c.w, c.p);
  return f;
}

TEST(CnnMeta, ConvAllocatesExactlyWhatCpuAllocates) {
  ConvMode restore;
  const std::vector<ConvCase> cases = {
      kDetConvs[0], kDetConvs[1], ConvCase{Shape{2, 3, 7, 5}, Shape{4, 3, 3, 3}, make_conv(2, 1, 1, 1, 1, 1, 1), true},
      ConvCase{Shape{64, 16, 32, 32}, Shape{16, 16, 3, 3}, make_conv(1, 1, 1, 1, 1, 1, 1), true}};
  for (const PathMode& mode : {PathMode{ConvPath::automatic, 0}, PathMode{ConvPath::im2col, 2},
                               PathMode{ConvPath::implicit, 0}, PathMode{ConvPath::direct, 2}}) {
    mode.apply();
    for (const ConvCase& c : cases) {
      SCOPED_TRACE(c.x.str() + " * " + c.w.str() + " (" + mode.str() + ")");
      const Footprint fc = conv_footprint(cpu(), c), fm = conv_footprint(meta(), c);
      EXPECT_EQ(fc.peak, fm.peak);
      EXPECT_EQ(fc.held, fm.held);
      EXPECT_EQ(fc.ws_fwd, fm.ws_fwd);
      EXPECT_EQ(fc.ws_bwd, fm.ws_bwd);
      // The workspace was allocated and counted: the peak exceeds the outputs held (y, dx).
      EXPECT_GT(fc.ws_fwd, 0u);
      EXPECT_GE(fc.peak, fc.held + static_cast<int64_t>(std::min(fc.ws_fwd, fc.ws_bwd)));
    }
  }
}

TEST(CnnMeta, WorkspaceDependsOnlyOnShapes) {
  ThreadCount restore;
  const Shape x{64, 64, 32, 32}, w{64, 64, 3, 3};
  const Conv2dParams p = make_conv(1, 1, 1, 1, 1, 1, 1);
  omp_set_num_threads(1);
  const size_t f1 = cpu().conv2d_forward_workspace(x, w, p), b1 = cpu().conv2d_backward_workspace(x, w, p);
  omp_set_num_threads(2);
  EXPECT_EQ(cpu().conv2d_forward_workspace(x, w, p), f1);
  EXPECT_EQ(cpu().conv2d_backward_workspace(x, w, p), b1);
  // Bounded: a chunk of images, not the whole batch (64 images of 576 x 1024 columns).
  EXPECT_LT(f1, static_cast<size_t>(64) * 576 * 1024 * 4 / 4);
}

}  // namespace
