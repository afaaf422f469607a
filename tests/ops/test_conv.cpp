// The 2-D convolution of the CPU backend (src/backends/cpu/conv.cpp): PyTorch goldens
// (tools/reference/golden/cnn.py; bf16: tools/reference/golden/bf16_ops.py), finite differences, a direct-loop
// reference, conv2d's three ways of feeding its GEMMs and its micro-kernels against each
// other, its workspace use, determinism (run to run and across thread counts), errors, and
// the meta backend's memory accounting.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cpu/conv_internal.h"
#include "ops/op_test.h"
#include "remat/backend.h"
#include "remat/memory.h"
#include "remat/ops.h"
#include "support/expect_error.h"
#include "support/golden.h"
#include "support/gradcheck.h"

namespace remat::test {
namespace {

// Tolerances against PyTorch and the double-precision references. Values are O(1) sums of
// at most a few hundred fp32 products, accumulated in another order than PyTorch's: errors
// of a few ulp of the largest partial sum, ~1e-6. rtol 1e-4 / atol 1e-5 leaves margin
// without hiding a wrong index or a missed term (O(0.01) to O(1) errors).
constexpr double kRtol = 1e-4;
constexpr double kAtol = 1e-5;

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

// ---- PyTorch goldens ------------------------------------------------------------------------

// Both ways of feeding the GEMM (explicit im2col, and the implicit one of stride-1
// convolutions where it applies) against PyTorch.
TEST(Conv, Conv2dForwardBackwardMatchesPyTorch) {
  const auto names = cnn_cases("conv_");
  ASSERT_GE(names.size(), 8u) << "conv goldens missing: run tools/reference/gen_golden.py cnn";
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
      const Tensor dx = Tensor::full(x.shape(), std::nanf(""));
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

// ---- Finite differences (L = sum(dy * y)) -----------------------------------------------------

TEST(Conv, GradientsMatchFiniteDifferences) {
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

TEST(Conv, MatchesDirectLoops) {
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

void expect_same(const ConvRun& a, const ConvRun& b) {
  EXPECT_TRUE(bitwise_equal(a.y, b.y));
  EXPECT_TRUE(bitwise_equal(a.dx, b.dx));
  EXPECT_TRUE(bitwise_equal(a.dw, b.dw));
  ASSERT_EQ(a.db.defined(), b.db.defined());
  if (a.db.defined()) {
    EXPECT_TRUE(bitwise_equal(a.db, b.db));
  }
}

// Large enough that every parallel loop has work for several threads; conv2d with groups,
// stride 1 and stride 2 (dx by col2im), on the paths chosen and forced, in several chunks.
const std::vector<ConvCase> kDetConvs = {
    {Shape{5, 8, 40, 40}, Shape{12, 4, 3, 3}, make_conv(1, 1, 1, 1, 1, 1, 2), true},
    {Shape{5, 8, 40, 40}, Shape{12, 4, 3, 3}, make_conv(2, 2, 1, 1, 1, 1, 2), true},
};

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

TEST(Conv, RunToRunBitwiseEqual) {
  ConvMode restore;
  expect_same(run_det_convs(), run_det_convs());
}

// Any thread count gives the same bits: every output is computed by one thread in a fixed
// order (conv2d's GEMM included; it does not use a BLAS thread pool).
TEST(Conv, ThreadCountDoesNotChangeResults) {
  ConvMode restore_conv;
  ThreadCount restore;
  omp_set_num_threads(1);
  const auto c1 = run_det_convs();
  for (int threads : {2, 3}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    omp_set_num_threads(threads);
    expect_same(c1, run_det_convs());
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

TEST(Conv, GemmFeedsAgree) {
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
TEST(Conv, WorkspaceIsExactlyWhatIsUsed) {
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
      const Tensor dx = Tensor::full(c.x, std::nanf(""));
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

TEST(Conv, MicroKernelsAgreeBitwise) {
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

TEST(Conv, BadArgumentsNameTheOpAndShapes) {
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

TEST(Conv, MetaAllocatesExactlyWhatCpuAllocates) {
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

TEST(Conv, WorkspaceDependsOnlyOnShapes) {
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

// ---- bf16 ----------------------------------------------------------------------------------

TEST(Conv, Bf16MatchesPyTorch) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  auto f = load_golden("bf16_ops/conv2d");
  Conv2dParams p;
  p.pad_h = p.pad_w = static_cast<int>(remat::test::meta_int(f, "padding"));
  p.groups = static_cast<int>(remat::test::meta_int(f, "groups"));
  Tensor x = bf16_in(f, "x"), w = bf16_in(f, "w"), b = bf16_in(f, "b");
  Tensor y = bf16_empty(f.tensor("y").shape());
  Tensor ws =
      Tensor::empty(Shape{static_cast<int64_t>(cpu().conv2d_forward_workspace(x.shape(), w.shape(), p) / 4 + 1)});
  cpu().conv2d_forward(x, w, b, p, y, ws);
  expect_bf16_golden(f, "y", y, 1, 1);  // GEMMs: another summation order may move a rounding by one step
  Tensor dx = bf16_empty(x.shape()), dw = Tensor::zeros(w.shape()), db = Tensor::zeros(b.shape());
  Tensor wsb =
      Tensor::empty(Shape{static_cast<int64_t>(cpu().conv2d_backward_workspace(x.shape(), w.shape(), p) / 4 + 1)});
  cpu().conv2d_backward(bf16_in(f, "dy"), x, w, p, dx, dw, db, wsb);
  expect_bf16_golden(f, "dx", dx, 1, 1);
  expect_bf16_golden(f, "dw", dw, 1, 1);
  expect_bf16_golden(f, "db", db, 1, 1);
}

// conv2d stages chunks of images in its workspace: y and dx are the rounded fp32 results
// and dw, db the fp32 ones, bitwise, on every GEMM feed and with chunks of 2 images (the
// last one partial); the first layer's f32 input (a batch) with a bf16 output works too.
TEST(Conv, Bf16IsTheRoundedFp32OpOnEveryPathAndChunking) {
  ActivationDTypeScope bf16_activations(DType::bf16);
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
        Bf16Pair x = random_pair(Shape{N, C, H, W}, 26), w = random_pair(Shape{K, C / p.groups, cs.r, cs.r}, 27),
                 b = random_pair(Shape{K}, 28), y = empty_pair(Shape{N, K, P, Q});
        auto ws = [&](size_t bytes) { return Tensor::empty(Shape{static_cast<int64_t>(bytes / 4 + 1)}); };
        Tensor wsf, wsb_f;
        {
          ActivationDTypeScope f32(DType::f32);
          wsf = ws(cpu().conv2d_forward_workspace(x.f.shape(), w.f.shape(), p));
          wsb_f = ws(cpu().conv2d_backward_workspace(x.f.shape(), w.f.shape(), p));
          cpu().conv2d_forward(x.f, w.f, b.f, p, y.f, wsf);
        }
        Tensor wsh = ws(cpu().conv2d_forward_workspace(x.h.shape(), w.h.shape(), p));
        EXPECT_GT(wsh.nbytes(), wsf.nbytes()) << "the bf16 staging is workspace";
        cpu().conv2d_forward(x.h, w.h, b.h, p, y.h, wsh);
        expect_rounded(y, "conv2d_forward");
        Bf16Pair y_from_f32 = empty_pair(Shape{N, K, P, Q});  // f32 input, bf16 output
        cpu().conv2d_forward(x.f, w.h, b.h, p, y_from_f32.h, wsh);
        EXPECT_EQ(bits(y_from_f32.h), bits(y.h));

        Bf16Pair dy = random_pair(Shape{N, K, P, Q}, 29), dx = empty_pair(Shape{N, C, H, W});
        Tensor dwf = Tensor::zeros(w.f.shape()), dwh = Tensor::zeros(w.f.shape()), dbf = Tensor::zeros(Shape{K}),
               dbh = Tensor::zeros(Shape{K});
        {
          ActivationDTypeScope f32(DType::f32);
          cpu().conv2d_backward(dy.f, x.f, w.f, p, dx.f, dwf, dbf, wsb_f);
        }
        Tensor wsb_h = ws(cpu().conv2d_backward_workspace(x.h.shape(), w.h.shape(), p));
        cpu().conv2d_backward(dy.h, x.h, w.h, p, dx.h, dwh, dbh, wsb_h);
        expect_rounded(dx, "conv2d_backward dx");
        EXPECT_EQ(dwf.to_vector(), dwh.to_vector()) << "dw";
        EXPECT_EQ(dbf.to_vector(), dbh.to_vector()) << "db";
      }
  cpu_conv::set_path(cpu_conv::Path::automatic);
  cpu_conv::set_chunk_images(0);
}

}  // namespace
}  // namespace remat::test
