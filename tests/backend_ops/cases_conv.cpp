// conv2d forward and backward against the CPU backend: the shapes of the shipped models
// (models/fashion_cnn.json, models/resnet_tiny.json) at batch 2-3, and odd ones (stride 2
// over odd sizes, dilation, groups, depthwise, asymmetric parameters, no bias, empty
// dimensions, several workspace chunks). On a GPU each case runs on both paths
// (REMAT_CONV=im2col and cudnn); on cuda-emu there is only im2col.
//
// Tolerance: the GEMMs sum in another order than the CPU's one FMA chain per output. The
// rounding error of a sum of `depth` products of values in [-1, 1] (rms ~1/3) grows like
// u * depth / 3 (u = 2^-24 ~ 6e-8: partial sums of size ~sqrt(depth)/3, ~sqrt(depth)
// roundings), whatever the result's size; the differences seen on cuda-emu stay below
// 4e-8 * depth. We allow 5e-7 * depth absolute (at least 1e-5: >10x margin) plus 1e-5
// relative for large sums, still far below an indexing mistake (errors of order 0.1-1).
// The depth is Cg*R*S for y, Kg*R*S for dx (a GEMM of depth Kg, then R*S terms added by
// col2im) and N*P*Q for dw. db is summed in double on both sides: 1e-6.
//
// bf16 (conv/bf16, training.precision bf16): bf16 x, w, b, dy; y and dx bf16, dw and db
// f32. Against the CPU's bf16 op: the tolerances above plus a bf16 step (kBf16Rel) on y and
// dx, dw and db as above. On cuda-emu, whose cublasGemmEx is an sgemm of the widened
// operands, also bitwise the device's own fp32 op on the widened values (y and dx rounded,
// dw and db the same bits): the bf16 path is the fp32 path plus the conversions. Mixed
// dtypes (an f32 x, the first layer's batch, with bf16 filters; f32 filters with bf16
// activations) run remat's own FMA GEMM on the device: against the CPU within the same
// tolerances.
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "backend_ops/harness.h"
#include "remat/device.h"
#include "remat/dtype.h"

namespace remat::test {

namespace {

// Sets an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      had_ = true;
      old_ = old;
    }
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

std::vector<const char*> conv_paths(const OpCheck& t) {
  if (t.device().is_cuda()) return {"im2col", "cudnn"};
  return {"im2col"};
}

double atol(int64_t depth) { return std::max(1e-5, 5e-7 * static_cast<double>(depth)); }
constexpr double kRtol = 1e-5;

// Guarded outputs (the harness's) are not 16-byte aligned, so the float4 paths of the
// layout kernels need unguarded ones: aligned, NaN-filled like a guarded one.
enum class Buffers { guarded, aligned };

Pair output(OpCheck& t, const Shape& s, Buffers buffers) {
  if (buffers == Buffers::guarded) return t.output(s);
  return t.values(std::vector<float>(static_cast<size_t>(s.numel()), std::numeric_limits<float>::quiet_NaN()), s);
}

// A workspace for each side: the CPU's own, and on the device a NaN-filled buffer of exactly
// the size the device asked for (so reads of unwritten workspace show up, and with guards,
// overruns).
struct Workspace {
  Tensor ref, dut;
  Tensor operator()(Side s) const { return s.ref ? ref : dut; }
};

Workspace make_workspace(OpCheck& t, size_t ref_bytes, size_t dut_bytes, Buffers buffers = Buffers::guarded) {
  Workspace w;
  const auto floats = [](size_t bytes) { return static_cast<int64_t>((bytes + 3) / 4); };
  if (ref_bytes) w.ref = Tensor::empty(Shape{floats(ref_bytes)}, Device::cpu());
  if (dut_bytes) w.dut = output(t, Shape{floats(dut_bytes)}, buffers).dut;
  return w;
}

void check_conv(OpCheck& t, const Shape& xs, const Shape& ws, const Conv2dParams& p, bool bias,
                Buffers buffers = Buffers::guarded) {
  const Shape ys = conv2d_output_shape(xs, ws, p);
  auto x = t.uniform(xs), w = t.uniform(ws), dy = t.uniform(ys);
  Pair b;
  if (bias) b = t.uniform(Shape{ws[0]});
  const auto dw0 = t.uniform(ws), db0 = t.uniform(Shape{ws[0]});
  const int64_t kg = p.groups > 0 ? ws[0] / p.groups : 0;
  const double y_tol = atol(ws[1] * ws[2] * ws[3]), dx_tol = atol(kg * ws[2] * ws[3]);
  const double dw_tol = atol(ys[0] * ys[2] * ys[3]);
  Backend& ref = backend_for(Device::cpu());
  Backend& dut = backend_for(t.device());

  for (const char* path : conv_paths(t)) {
    ScopedEnv scope("REMAT_CONV", path);
    const std::string tag = std::string(" (") + path + ")";

    auto y = output(t, ys, buffers);
    const Workspace fws =
        make_workspace(t, ref.conv2d_forward_workspace(xs, ws, p), dut.conv2d_forward_workspace(xs, ws, p), buffers);
    t.run([&](Backend& be, Side s) { be.conv2d_forward(s(x), s(w), s(b), p, s(y), fws(s)); });
    t.expect_close(y, y_tol, kRtol, "y" + tag);

    auto dx = output(t, xs, buffers);
    auto dw = t.output_like(dw0);  // accumulated into
    auto db = t.output_like(db0);
    const Workspace bws =
        make_workspace(t, ref.conv2d_backward_workspace(xs, ws, p), dut.conv2d_backward_workspace(xs, ws, p), buffers);
    t.run([&](Backend& be, Side s) { be.conv2d_backward(s(dy), s(x), s(w), p, s(dx), s(dw), s(db), bws(s)); });
    t.expect_close(dx, dx_tol, kRtol, "dx" + tag);
    t.expect_close(dw, dw_tol, kRtol, "dw" + tag);
    t.expect_close(db, 1e-6, 1e-6, "db" + tag);

    // Only some gradients: dx alone, dw alone (db untouched when undefined).
    auto dx_only = t.output(xs);
    auto dw_only = t.output_like(dw0);
    t.run([&](Backend& be, Side s) {
      be.conv2d_backward(s(dy), s(x), s(w), p, s(dx_only), Tensor(), Tensor(), bws(s));
      be.conv2d_backward(s(dy), s(x), s(w), p, Tensor(), s(dw_only), Tensor(), bws(s));
    });
    t.expect_close(dx_only, dx_tol, kRtol, "dx alone" + tag);
    t.expect_close(dw_only, dw_tol, kRtol, "dw alone" + tag);
  }
}

Conv2dParams params(int stride, int pad, int dilation = 1, int groups = 1) {
  Conv2dParams p;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = pad;
  p.dilation_h = p.dilation_w = dilation;
  p.groups = groups;
  return p;
}

}  // namespace

// fashion_cnn: conv 1 -> 32, 5x5, padding 2 on 28x28; conv2 32 -> 64 on 14x14.
REMAT_OP_CASE(conv, fashion_conv1) { check_conv(t, {2, 1, 28, 28}, {32, 1, 5, 5}, params(1, 2), true); }
REMAT_OP_CASE(conv, fashion_conv2) { check_conv(t, {2, 32, 14, 14}, {64, 32, 5, 5}, params(1, 2), true); }

// resnet_tiny: the stem (1 -> 16, 3x3, no bias), a residual 3x3, the strided downsampling
// 3x3 and its 1x1 stride-2 shortcut, and the last stage at 7x7.
REMAT_OP_CASE(conv, resnet_stem) { check_conv(t, {2, 1, 28, 28}, {16, 1, 3, 3}, params(1, 1), false); }
REMAT_OP_CASE(conv, resnet_block) { check_conv(t, {2, 16, 28, 28}, {16, 16, 3, 3}, params(1, 1), false); }
REMAT_OP_CASE(conv, resnet_down) { check_conv(t, {2, 16, 28, 28}, {32, 16, 3, 3}, params(2, 1), false); }
REMAT_OP_CASE(conv, resnet_shortcut_1x1_stride2) {
  check_conv(t, {2, 32, 14, 14}, {64, 32, 1, 1}, params(2, 0), false);
}
REMAT_OP_CASE(conv, resnet_last_stage) { check_conv(t, {3, 64, 7, 7}, {64, 64, 3, 3}, params(1, 1), false); }

// 1x1, stride 1, no padding: x is its own column matrix (forward without im2col).
REMAT_OP_CASE(conv, pointwise) {
  check_conv(t, {3, 16, 7, 5}, {24, 16, 1, 1}, params(1, 0), true);
  check_conv(t, {2, 6, 5, 5}, {4, 3, 1, 1}, params(1, 0, 1, 2), true);  // grouped
}

REMAT_OP_CASE(conv, stride2_odd_sizes) { check_conv(t, {3, 4, 9, 11}, {6, 4, 3, 3}, params(2, 1), true); }
REMAT_OP_CASE(conv, dilation2) { check_conv(t, {2, 3, 10, 9}, {5, 3, 3, 3}, params(1, 2, 2), true); }

REMAT_OP_CASE(conv, groups) {
  check_conv(t, {2, 6, 8, 7}, {4, 3, 3, 3}, params(1, 1, 1, 2), true);   // batched over groups
  check_conv(t, {3, 6, 8, 7}, {4, 3, 3, 3}, params(1, 1, 1, 2), false);  // batched over images
  check_conv(t, {2, 4, 6, 6}, {4, 1, 3, 3}, params(1, 1, 1, 4), true);   // depthwise
}

REMAT_OP_CASE(conv, asymmetric_params) {
  Conv2dParams p;
  p.stride_h = 2;
  p.stride_w = 1;
  p.pad_h = 0;
  p.pad_w = 1;
  p.dilation_h = 1;
  p.dilation_w = 2;
  check_conv(t, {2, 3, 11, 8}, {5, 3, 3, 2}, p, true);
  // A kernel as large as the padded input: one output position.
  check_conv(t, {1, 2, 4, 5}, {3, 2, 6, 7}, params(1, 1), true);
}

// Empty dimensions: no input channels (y = bias), no filters (dx = 0), no images.
REMAT_OP_CASE(conv, empty_dims) {
  check_conv(t, {2, 0, 5, 5}, {3, 0, 3, 3}, params(1, 1), true);
  check_conv(t, {2, 3, 5, 5}, {0, 3, 3, 3}, params(1, 1), true);
  check_conv(t, {0, 3, 5, 5}, {4, 3, 3, 3}, params(1, 1), true);
}

// Aligned outputs and workspace: the float4 paths of the bias broadcast and of the dy
// transpose (planes of 144 and 36 floats).
REMAT_OP_CASE(conv, aligned_buffers) {
  check_conv(t, {2, 8, 12, 12}, {16, 8, 3, 3}, params(1, 1), true, Buffers::aligned);
  check_conv(t, {3, 4, 12, 12}, {6, 4, 3, 3}, params(2, 1), true, Buffers::aligned);
}

// 30 images of 32 x 32 x 32 need about 35 MB of columns: the im2col path takes them in
// two chunks of 15.
REMAT_OP_CASE(conv, two_workspace_chunks) { check_conv(t, {30, 32, 32, 32}, {8, 32, 3, 3}, params(1, 1), true); }

// The same inputs twice give the same bits (dw accumulates in a fixed order).
REMAT_OP_CASE(conv, deterministic) {
  const Shape xs{3, 8, 12, 12}, ws{16, 8, 3, 3};
  const Conv2dParams p = params(2, 1);
  const Shape ys = conv2d_output_shape(xs, ws, p);
  auto x = t.uniform(xs), w = t.uniform(ws), dy = t.uniform(ys);
  const auto dw0 = t.uniform(ws);
  Backend& dut = backend_for(t.device());
  for (const char* path : conv_paths(t)) {
    ScopedEnv scope("REMAT_CONV", path);
    auto dx1 = t.output(xs), dx2 = t.output(xs);
    auto dw1 = t.output_like(dw0), dw2 = t.output_like(dw0);
    const Workspace bws = make_workspace(t, 0, dut.conv2d_backward_workspace(xs, ws, p));
    dut.conv2d_backward(dy.dut, x.dut, w.dut, p, dx1.dut, dw1.dut, Tensor(), bws.dut);
    dut.conv2d_backward(dy.dut, x.dut, w.dut, p, dx2.dut, dw2.dut, Tensor(), bws.dut);
    EXPECT_EQ(dx1.dut.to_vector(), dx2.dut.to_vector()) << path;
    EXPECT_EQ(dw1.dut.to_vector(), dw2.dut.to_vector()) << path;
  }
}

}  // namespace remat::test

namespace remat::test {

namespace {

// The bf16 variant of check_conv, inside ActivationDTypeScope(bf16) (workspaces from the
// bf16 queries, exactly their size, NaN-filled and guarded).
void check_conv_bf16(OpCheck& t, const Shape& xs, const Shape& ws, const Conv2dParams& p, bool bias) {
  ActivationDTypeScope scope(DType::bf16);
  const Shape ys = conv2d_output_shape(xs, ws, p);
  auto x = t.uniform_bf16(xs), w = t.uniform_bf16(ws), dy = t.uniform_bf16(ys);
  auto xf = t.as_f32(x), wf = t.as_f32(w), dyf = t.as_f32(dy);
  Pair b, bf;
  if (bias) {
    b = t.uniform_bf16(Shape{ws[0]});
    bf = t.as_f32(b);
  }
  const auto dw0 = t.uniform(ws), db0 = t.uniform(Shape{ws[0]});
  const int64_t kg = p.groups > 0 ? ws[0] / p.groups : 0;
  const double y_tol = atol(ws[1] * ws[2] * ws[3]), dx_tol = atol(kg * ws[2] * ws[3]);
  const double dw_tol = atol(ys[0] * ys[2] * ys[3]);
  const bool emu = t.device().is_cuda_emu();
  Backend& ref = backend_for(Device::cpu());
  Backend& dut = backend_for(t.device());

  for (const char* path : conv_paths(t)) {
    ScopedEnv env("REMAT_CONV", path);
    const std::string tag = std::string(" (bf16, ") + path + ")";
    const Workspace fws =
        make_workspace(t, ref.conv2d_forward_workspace(xs, ws, p), dut.conv2d_forward_workspace(xs, ws, p));
    const Workspace bws =
        make_workspace(t, ref.conv2d_backward_workspace(xs, ws, p), dut.conv2d_backward_workspace(xs, ws, p));
    auto y = t.output(ys, DType::bf16), yf = t.output(ys);
    t.run([&](Backend& be, Side s) {
      be.conv2d_forward(s(x), s(w), s(b), p, s(y), fws(s));
      be.conv2d_forward(s(xf), s(wf), s(bf), p, s(yf), fws(s));  // the fp32 op inside the bf16 scope
    });
    t.expect_close(y, y_tol, kRtol + kBf16Rel, "y" + tag);
    t.expect_close(yf, y_tol, kRtol, "y (fp32 in the bf16 scope)" + tag);
    if (emu) expect_rounded_dut(y, yf, "y against fp32" + tag);

    auto dx = t.output(xs, DType::bf16), dxf = t.output(xs);
    auto dw = t.output_like(dw0), dwf = t.output_like(dw0);
    auto db = t.output_like(db0), dbf = t.output_like(db0);
    t.run([&](Backend& be, Side s) {
      be.conv2d_backward(s(dy), s(x), s(w), p, s(dx), s(dw), s(db), bws(s));
      be.conv2d_backward(s(dyf), s(xf), s(wf), p, s(dxf), s(dwf), s(dbf), bws(s));
    });
    t.expect_close(dx, dx_tol, kRtol + kBf16Rel, "dx" + tag);
    t.expect_close(dw, dw_tol, kRtol, "dw (f32)" + tag);
    t.expect_close(db, 1e-6, 1e-6, "db (f32)" + tag);
    t.expect_close(dxf, dx_tol, kRtol, "dx (fp32 in the bf16 scope)" + tag);
    t.expect_close(dwf, dw_tol, kRtol, "dw (fp32 in the bf16 scope)" + tag);
    expect_same_dut_f32(db, dbf, "db against fp32" + tag);
    if (emu) {
      expect_rounded_dut(dx, dxf, "dx against fp32" + tag);
      expect_same_dut_f32(dw, dwf, "dw against fp32" + tag);
    }

    // Mixed dtypes: the first layer, an f32 x (not bf16 values) with bf16 filters into a bf16
    // y (dw from it, without dx, as its backward runs); f32 filters (frozen) with bf16 x, y,
    // dy and dx.
    auto x32 = t.uniform(xs);
    auto y1 = t.output(ys, DType::bf16), y2 = t.output(ys, DType::bf16);
    auto dw1 = t.output_like(dw0), dw2 = t.output_like(dw0);
    auto dx2 = t.output(xs, DType::bf16);
    t.run([&](Backend& be, Side s) {
      be.conv2d_forward(s(x32), s(w), s(b), p, s(y1), fws(s));
      be.conv2d_backward(s(dy), s(x32), s(w), p, Tensor(), s(dw1), Tensor(), bws(s));
      be.conv2d_forward(s(x), s(wf), s(b), p, s(y2), fws(s));
      be.conv2d_backward(s(dy), s(x), s(wf), p, s(dx2), s(dw2), Tensor(), bws(s));
    });
    t.expect_close(y1, y_tol, kRtol + kBf16Rel, "y from an f32 x" + tag);
    t.expect_close(dw1, dw_tol, kRtol, "dw from an f32 x" + tag);
    t.expect_close(y2, y_tol, kRtol + kBf16Rel, "y with f32 filters" + tag);
    t.expect_close(dx2, dx_tol, kRtol + kBf16Rel, "dx with f32 filters" + tag);
    t.expect_close(dw2, dw_tol, kRtol, "dw with f32 filters" + tag);
  }
}

}  // namespace

// The bf16 shapes: fashion_cnn's first layer (1 channel, 5x5), a 3x3 block without bias, a
// strided grouped one (batched over groups), a pointwise one (x read directly, in either
// dtype), dilation, and two workspace chunks (30 images).
REMAT_OP_CASE(conv, bf16) {
  check_conv_bf16(t, {2, 1, 28, 28}, {8, 1, 5, 5}, params(1, 2), true);
  check_conv_bf16(t, {3, 8, 12, 12}, {16, 8, 3, 3}, params(1, 1), false);
  check_conv_bf16(t, {2, 6, 9, 11}, {4, 3, 3, 3}, params(2, 1, 1, 2), true);
  check_conv_bf16(t, {3, 16, 7, 5}, {24, 16, 1, 1}, params(1, 0), true);
  check_conv_bf16(t, {2, 3, 10, 9}, {5, 3, 3, 3}, params(1, 2, 2), true);
}

REMAT_OP_CASE(conv, bf16_two_workspace_chunks) {
  check_conv_bf16(t, {30, 32, 32, 32}, {8, 32, 3, 3}, params(1, 1), true);
}

// ---- Gradients: the device's backward against central differences of its own forward --------
// (backend_ops/harness.h, "Gradient cases")

REMAT_OP_CASE(conv, grad_conv2d) {
  // Stride 2, padding 1, two groups, a bias: every index path of dx and dw.
  const Shape xs{2, 4, 7, 6}, ws{6, 2, 3, 3};
  Conv2dParams p;
  p.stride_h = p.stride_w = 2;
  p.pad_h = p.pad_w = 1;
  p.groups = 2;
  const Shape ys = conv2d_output_shape(xs, ws, p);
  auto x = t.uniform(xs), w = t.uniform(ws, -0.5f, 0.5f), b = t.uniform({6}), dy = t.uniform(ys);
  auto dx = t.output(xs), dw = t.output_like(t.values(std::vector<float>(ws.numel(), 0.0f), ws));
  auto db = t.output_like(t.values(std::vector<float>(6, 0.0f), {6}));
  auto y = t.output(ys);
  t.run([&](Backend& be, Side d) {
    const size_t bytes = be.conv2d_backward_workspace(xs, ws, p);
    Tensor work = bytes ? Tensor::empty(Shape{static_cast<int64_t>((bytes + 3) / 4)}, be.device()) : Tensor();
    be.conv2d_backward(d(dy), d(x), d(w), p, d(dx), d(dw), d(db), work);
  });
  auto loss = [&](Backend& be) {
    const size_t bytes = be.conv2d_forward_workspace(xs, ws, p);
    Tensor work = bytes ? Tensor::empty(Shape{static_cast<int64_t>((bytes + 3) / 4)}, be.device()) : Tensor();
    be.conv2d_forward(x.dut, w.dut, b.dut, p, y.dut, work);
    return dot(dy.dut, y.dut);
  };
  t.expect_gradient("conv2d dx", x, dx, loss);
  t.expect_gradient("conv2d dw", w, dw, loss);
  t.expect_gradient("conv2d db", b, db, loss);
}

}  // namespace remat::test
