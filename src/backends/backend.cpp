// Validation of every op's arguments (shared by all backends), then dispatch to *_impl:
// the public methods of Backend are generated from remat/backend_ops.def at the end of
// this file, each calling its check_<op> below. An op without a validator does not compile.
// Messages name the op, the argument and the shapes involved.
#include "remat/backend.h"

#include <cmath>
#include <string_view>

#include "remat/error.h"

namespace remat {

namespace {

struct Check {
  std::string_view op;
  Device device;
  Backend* be = nullptr;  // the backend being validated (its workspace queries); null for shape helpers

  [[noreturn]] void fail(const std::string& msg) const { REMAT_THROW(op, ": ", msg); }

  // A defined tensor of the dtype, on this backend's device.
  void tensor(const char* name, const Tensor& t, DType dtype = DType::f32) const {
    if (!t.defined()) fail(std::string(name) + " is undefined");
    const bool activation = dtype == DType::f32 && t.dtype() == activation_dtype();  // bf16 storage
    if (t.dtype() != dtype && !activation)
      fail(std::string(name) + " " + t.str() + ": expected dtype " + dtype_name(dtype));
    if (t.device() != device) fail(std::string(name) + " " + t.str() + ": expected a tensor on " + device.str());
  }
  // A tensor that stays f32 whatever activation_dtype() says: normalisation statistics, the
  // loss and cross-entropy's row statistics (they need fp32's range and precision).
  void statistics(const char* name, const Tensor& t) const {
    if (!t.defined()) fail(std::string(name) + " is undefined");
    if (t.dtype() != DType::f32)
      fail(std::string(name) + " " + t.str() + ": expected dtype f32 (statistics stay f32 under bf16 activations)");
    if (t.device() != device) fail(std::string(name) + " " + t.str() + ": expected a tensor on " + device.str());
  }
  void rank(const char* name, const Tensor& t, int r) const {
    if (t.rank() != r) fail(std::string(name) + " " + t.str() + ": expected rank " + std::to_string(r));
  }
  void min_rank(const char* name, const Tensor& t, int r) const {
    if (t.rank() < r) fail(std::string(name) + " " + t.str() + ": expected rank >= " + std::to_string(r));
  }
  void shape(const char* name, const Tensor& t, const Shape& want) const {
    if (t.shape() != want) fail(std::string(name) + " " + t.str() + ": expected shape " + want.str());
  }
  void same_shape(const char* an, const Tensor& a, const char* bn, const Tensor& b) const {
    if (a.shape() != b.shape())
      fail(std::string(an) + " " + a.str() + " and " + bn + " " + b.str() + " must have the same shape");
  }
  void optional(const char* name, const Tensor& t, const Shape& want, DType dtype = DType::f32) const {
    if (!t.defined()) return;
    tensor(name, t, dtype);
    shape(name, t, want);
  }
  void positive(const char* name, int64_t v) const {
    if (v <= 0) fail(std::string(name) + " must be positive, got " + std::to_string(v));
  }
  void non_negative(const char* name, int64_t v) const {
    if (v < 0) fail(std::string(name) + " must be non-negative, got " + std::to_string(v));
  }
  void probability(const char* name, float p) const {
    if (!(p >= 0.0f && p <= 1.0f)) fail(std::string(name) + " must be in [0, 1], got " + std::to_string(p));
  }
  void workspace(const Tensor& ws, size_t need) const {
    if (need == 0) return;
    if (!ws.defined() || ws.nbytes() < need)
      fail("workspace of " + std::to_string(need) + " bytes needed, got " +
           (ws.defined() ? std::to_string(ws.nbytes()) : std::string("none")));
    if (ws.device() != device) fail("workspace " + ws.str() + ": expected a tensor on " + device.str());
  }
};

Shape with_last(const Shape& s, int64_t last) {
  auto d = s.dims();
  d.back() = last;
  return Shape(d);
}

int64_t rows_of(const Shape& s) { return s.rank() == 0 ? 1 : s.numel() / std::max<int64_t>(s[-1], 1); }

void check_conv(const Check& c, const Shape& x, const Shape& w, const Conv2dParams& p) {
  if (x.rank() != 4) c.fail("x " + x.str() + ": expected rank 4 (N, C, H, W)");
  if (w.rank() != 4) c.fail("w " + w.str() + ": expected rank 4 (K, C / groups, R, S)");
  c.positive("groups", p.groups);
  c.positive("stride_h", p.stride_h);
  c.positive("stride_w", p.stride_w);
  c.positive("dilation_h", p.dilation_h);
  c.positive("dilation_w", p.dilation_w);
  c.non_negative("pad_h", p.pad_h);
  c.non_negative("pad_w", p.pad_w);
  if (x[1] % p.groups != 0 || w[0] % p.groups != 0)
    c.fail("x " + x.str() + " and w " + w.str() + ": channels must divide by groups " + std::to_string(p.groups));
  if (w[1] * p.groups != x[1])
    c.fail("x " + x.str() + " has " + std::to_string(x[1]) + " channels but w " + w.str() + " expects " +
           std::to_string(w[1] * p.groups));
  const int64_t eff_h = int64_t{p.dilation_h} * (w[2] - 1) + 1, eff_w = int64_t{p.dilation_w} * (w[3] - 1) + 1;
  if (eff_h > x[2] + 2 * p.pad_h || eff_w > x[3] + 2 * p.pad_w)
    c.fail("kernel " + w.str() + " (dilated " + std::to_string(eff_h) + "x" + std::to_string(eff_w) +
           ") is larger than the padded input " + x.str() + " (padding " + std::to_string(p.pad_h) + ", " +
           std::to_string(p.pad_w) + ")");
}

void check_pool(const Check& c, const Shape& x, const Pool2dParams& p) {
  if (x.rank() != 4) c.fail("x " + x.str() + ": expected rank 4 (N, C, H, W)");
  c.positive("kernel_h", p.kernel_h);
  c.positive("kernel_w", p.kernel_w);
  c.positive("stride_h", p.stride_h);
  c.positive("stride_w", p.stride_w);
  c.non_negative("pad_h", p.pad_h);
  c.non_negative("pad_w", p.pad_w);
  if (2 * p.pad_h > p.kernel_h || 2 * p.pad_w > p.kernel_w) c.fail("padding must be at most half the kernel size");
  if (p.kernel_h > x[2] + 2 * p.pad_h || p.kernel_w > x[3] + 2 * p.pad_w)
    c.fail("kernel " + std::to_string(p.kernel_h) + "x" + std::to_string(p.kernel_w) +
           " is larger than the padded input " + x.str());
}

// Max pooling's one-byte window offsets (include/remat/backend_ops.def).
void check_maxpool_window(const Check& c, const Pool2dParams& p) {
  const int64_t window = int64_t{p.kernel_h} * p.kernel_w;
  if (window > kMaxPoolWindow)
    c.fail("kernel " + std::to_string(p.kernel_h) + "x" + std::to_string(p.kernel_w) + " has " +
           std::to_string(window) + " positions; at most " + std::to_string(kMaxPoolWindow) +
           " (the saved index is one byte, an offset within the window)");
}

void check_attention(const Check& c, const Shape& qkv, const AttentionParams& p) {
  if (qkv.rank() != 3) c.fail("qkv " + qkv.str() + ": expected rank 3 (B, T, 3C)");
  c.positive("n_head", p.n_head);
  c.probability("dropout", p.dropout);
  if (qkv[2] <= 0) c.fail("qkv " + qkv.str() + ": last dimension (3 * C) must be positive");
  if (qkv[2] % (3 * int64_t{p.n_head}) != 0)
    c.fail("qkv " + qkv.str() + ": last dimension must be 3 * C with C divisible by n_head " +
           std::to_string(p.n_head));
}

}  // namespace

Shape conv2d_output_shape(const Shape& x, const Shape& w, const Conv2dParams& p) {
  check_conv(Check{"conv2d", Device::cpu()}, x, w, p);
  const int64_t ph = (x[2] + 2 * p.pad_h - int64_t{p.dilation_h} * (w[2] - 1) - 1) / p.stride_h + 1;
  const int64_t pw = (x[3] + 2 * p.pad_w - int64_t{p.dilation_w} * (w[3] - 1) - 1) / p.stride_w + 1;
  return Shape{x[0], w[0], ph, pw};
}

Shape pool2d_output_shape(const Shape& x, const Pool2dParams& p) {
  check_pool(Check{"pool2d", Device::cpu()}, x, p);
  return Shape{x[0], x[1], (x[2] + 2 * p.pad_h - p.kernel_h) / p.stride_h + 1,
               (x[3] + 2 * p.pad_w - p.kernel_w) / p.stride_w + 1};
}

// ---- The validators: check_<op> takes the op's arguments (all of them, so some go unused)
// and throws remat::Error naming the op, the argument and the shapes.

namespace {

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"

// ---- GEMM and linear -------------------------------------------------------------------

void check_gemm(const Check& ck, const Tensor& a, const Tensor& b, const Tensor& c, const GemmParams& p) {
  ck.tensor("a", a);
  ck.tensor("b", b);
  ck.tensor("c", c);
  ck.min_rank("a", a, 2);
  ck.min_rank("b", b, 2);
  ck.min_rank("c", c, 2);
  const int64_t m = p.trans_a ? a.size(-1) : a.size(-2), k = p.trans_a ? a.size(-2) : a.size(-1);
  const int64_t kb = p.trans_b ? b.size(-1) : b.size(-2), n = p.trans_b ? b.size(-2) : b.size(-1);
  if (k != kb)
    ck.fail("a " + a.str() + " and b " + b.str() + ": inner dimensions differ (" + std::to_string(k) + " vs " +
            std::to_string(kb) + ")");
  if (c.size(-2) != m || c.size(-1) != n)
    ck.fail("c " + c.str() + ": expected [..., " + std::to_string(m) + ", " + std::to_string(n) + "]");
  const int64_t batch = a.numel() / std::max<int64_t>(m * k, 1);
  if (c.numel() / std::max<int64_t>(m * n, 1) != batch ||
      (b.rank() > 2 && b.numel() / std::max<int64_t>(k * n, 1) != batch))
    ck.fail("batch dimensions of a " + a.str() + ", b " + b.str() + " and c " + c.str() + " differ");
}

void check_linear_forward(const Check& ck, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) {
  ck.tensor("x", x);
  ck.tensor("w", w);
  ck.tensor("y", y);
  ck.rank("w", w, 2);
  ck.min_rank("x", x, 1);
  if (x.size(-1) != w.size(1))
    ck.fail("x " + x.str() + " and w " + w.str() + ": in_features differ (" + std::to_string(x.size(-1)) + " vs " +
            std::to_string(w.size(1)) + ")");
  ck.shape("y", y, with_last(x.shape(), w.size(0)));
  ck.optional("b", b, Shape{w.size(0)});
}

void check_linear_backward(const Check& ck, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dx,
                           const Tensor& dw, const Tensor& db) {
  ck.tensor("dy", dy);
  ck.tensor("x", x);
  ck.tensor("w", w);
  ck.rank("w", w, 2);
  ck.min_rank("x", x, 1);
  if (x.size(-1) != w.size(1)) ck.fail("x " + x.str() + " and w " + w.str() + ": in_features differ");
  ck.shape("dy", dy, with_last(x.shape(), w.size(0)));
  ck.optional("dx", dx, x.shape());
  ck.optional("dw", dw, w.shape());
  ck.optional("db", db, Shape{w.size(0)});
}

// ---- Elementwise -------------------------------------------------------------------------

void check_add(const Check& ck, const Tensor& a, const Tensor& b, const Tensor& y) {
  ck.tensor("a", a);
  ck.tensor("b", b);
  ck.tensor("y", y);
  ck.same_shape("a", a, "b", b);
  ck.same_shape("a", a, "y", y);
}

void check_accumulate(const Check& ck, const Tensor& dst, const Tensor& src) {
  ck.tensor("dst", dst);
  ck.tensor("src", src);
  if (dst.numel() != src.numel()) ck.same_shape("dst", dst, "src", src);
}

void check_scale(const Check& ck, const Tensor& x, float alpha, const Tensor& y) {
  ck.tensor("x", x);
  ck.tensor("y", y);
  ck.same_shape("x", x, "y", y);
}

void check_relu_forward(const Check& ck, const Tensor& x, const Tensor& y) {
  ck.tensor("x", x);
  ck.tensor("y", y);
  ck.same_shape("x", x, "y", y);
}

void check_relu_backward(const Check& ck, const Tensor& dy, const Tensor& x, const Tensor& dx) {
  ck.tensor("dy", dy);
  ck.tensor("x", x);
  ck.tensor("dx", dx);
  ck.same_shape("dy", dy, "x", x);
  ck.same_shape("dx", dx, "x", x);
}

void check_gelu_forward(const Check& ck, const Tensor& x, GeluApprox approx, const Tensor& y) {
  ck.tensor("x", x);
  ck.tensor("y", y);
  ck.same_shape("x", x, "y", y);
}

void check_gelu_backward(const Check& ck, const Tensor& dy, const Tensor& x, GeluApprox approx, const Tensor& dx) {
  ck.tensor("dy", dy);
  ck.tensor("x", x);
  ck.tensor("dx", dx);
  ck.same_shape("dy", dy, "x", x);
  ck.same_shape("dx", dx, "x", x);
}

void check_dropout_forward(const Check& ck, const Tensor& x, float p, RngState rng, const Tensor& y) {
  ck.tensor("x", x);
  ck.tensor("y", y);
  ck.same_shape("x", x, "y", y);
  ck.probability("p", p);
}

void check_dropout_backward(const Check& ck, const Tensor& dy, float p, RngState rng, const Tensor& dx) {
  ck.tensor("dy", dy);
  ck.tensor("dx", dx);
  ck.same_shape("dy", dy, "dx", dx);
  ck.probability("p", p);
}

// ---- Softmax and losses --------------------------------------------------------------------

void check_softmax_forward(const Check& base, const Tensor& x, bool log, const Tensor& y) {
  const Check ck{log ? "log_softmax_forward" : "softmax_forward", base.device, base.be};
  ck.tensor("x", x);
  ck.tensor("y", y);
  ck.min_rank("x", x, 1);
  ck.same_shape("x", x, "y", y);
}

void check_softmax_backward(const Check& base, const Tensor& dy, const Tensor& y, bool log, const Tensor& dx) {
  const Check ck{log ? "log_softmax_backward" : "softmax_backward", base.device, base.be};
  ck.tensor("dy", dy);
  ck.tensor("y", y);
  ck.tensor("dx", dx);
  ck.min_rank("y", y, 1);
  ck.same_shape("dy", dy, "y", y);
  ck.same_shape("dx", dx, "y", y);
}

void check_cross_entropy_forward(const Check& ck, const Tensor& logits, const Tensor& targets, int ignore_index,
                                 const Tensor& loss, const Tensor& lse) {
  ck.tensor("logits", logits);
  ck.tensor("targets", targets, DType::i32);
  ck.rank("logits", logits, 2);
  ck.shape("targets", targets, Shape{logits.size(0)});
  ck.statistics("loss", loss);
  ck.shape("loss", loss, Shape{1});
  ck.statistics("lse", lse);
  ck.shape("lse", lse, Shape{logits.size(0)});
}

void check_cross_entropy_backward(const Check& ck, float dloss, const Tensor& logits, const Tensor& targets,
                                  const Tensor& lse, int ignore_index, const Tensor& dlogits) {
  ck.tensor("logits", logits);
  ck.tensor("targets", targets, DType::i32);
  ck.rank("logits", logits, 2);
  ck.shape("targets", targets, Shape{logits.size(0)});
  ck.statistics("lse", lse);
  ck.shape("lse", lse, Shape{logits.size(0)});
  ck.tensor("dlogits", dlogits);
  ck.same_shape("dlogits", dlogits, "logits", logits);
}

void check_accuracy(const Check& ck, const Tensor& logits, const Tensor& targets, int ignore_index, int64_t* counted) {
  ck.tensor("logits", logits);
  ck.tensor("targets", targets, DType::i32);
  ck.rank("logits", logits, 2);
  ck.shape("targets", targets, Shape{logits.size(0)});
}

// ---- Convolution and pooling --------------------------------------------------------------

void check_conv2d_forward_workspace(const Check& ck, const Shape& x, const Shape& w, const Conv2dParams& p) {
  check_conv(ck, x, w, p);
}

void check_conv2d_forward(const Check& ck, const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p,
                          const Tensor& y, const Tensor& workspace) {
  ck.tensor("x", x);
  ck.tensor("w", w);
  ck.tensor("y", y);
  check_conv(ck, x.shape(), w.shape(), p);
  ck.shape("y", y, conv2d_output_shape(x.shape(), w.shape(), p));
  ck.optional("b", b, Shape{w.size(0)});
  ck.workspace(workspace, ck.be->conv2d_forward_workspace(x.shape(), w.shape(), p));
}

void check_conv2d_backward_workspace(const Check& ck, const Shape& x, const Shape& w, const Conv2dParams& p) {
  check_conv(ck, x, w, p);
}

void check_conv2d_backward(const Check& ck, const Tensor& dy, const Tensor& x, const Tensor& w, const Conv2dParams& p,
                           const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& workspace) {
  ck.tensor("dy", dy);
  ck.tensor("x", x);
  ck.tensor("w", w);
  check_conv(ck, x.shape(), w.shape(), p);
  ck.shape("dy", dy, conv2d_output_shape(x.shape(), w.shape(), p));
  ck.optional("dx", dx, x.shape());
  ck.optional("dw", dw, w.shape());
  ck.optional("db", db, Shape{w.size(0)});
  ck.workspace(workspace, ck.be->conv2d_backward_workspace(x.shape(), w.shape(), p));
}

void check_maxpool2d_forward(const Check& ck, const Tensor& x, const Pool2dParams& p, const Tensor& y,
                             const Tensor& indices) {
  ck.tensor("x", x);
  ck.tensor("y", y);
  ck.tensor("indices", indices, DType::u8);
  check_pool(ck, x.shape(), p);
  check_maxpool_window(ck, p);
  ck.shape("y", y, pool2d_output_shape(x.shape(), p));
  ck.same_shape("indices", indices, "y", y);
}

void check_maxpool2d_backward(const Check& ck, const Tensor& dy, const Tensor& indices, const Pool2dParams& p,
                              const Tensor& dx) {
  ck.tensor("dy", dy);
  ck.tensor("indices", indices, DType::u8);
  ck.tensor("dx", dx);
  ck.rank("dx", dx, 4);
  check_pool(ck, dx.shape(), p);
  check_maxpool_window(ck, p);
  ck.shape("dy", dy, pool2d_output_shape(dx.shape(), p));
  ck.same_shape("indices", indices, "dy", dy);
}

void check_avgpool2d_forward(const Check& ck, const Tensor& x, const Pool2dParams& p, const Tensor& y) {
  ck.tensor("x", x);
  ck.tensor("y", y);
  check_pool(ck, x.shape(), p);
  ck.shape("y", y, pool2d_output_shape(x.shape(), p));
}

void check_avgpool2d_backward(const Check& ck, const Tensor& dy, const Pool2dParams& p, const Tensor& dx) {
  ck.tensor("dy", dy);
  ck.tensor("dx", dx);
  check_pool(ck, dx.shape(), p);
  ck.shape("dy", dy, pool2d_output_shape(dx.shape(), p));
}

void check_global_avgpool_forward(const Check& ck, const Tensor& x, const Tensor& y) {
  ck.tensor("x", x);
  ck.tensor("y", y);
  ck.rank("x", x, 4);
  ck.shape("y", y, Shape{x.size(0), x.size(1)});
}

void check_global_avgpool_backward(const Check& ck, const Tensor& dy, const Tensor& dx) {
  ck.tensor("dy", dy);
  ck.tensor("dx", dx);
  ck.rank("dx", dx, 4);
  ck.shape("dy", dy, Shape{dx.size(0), dx.size(1)});
}

// ---- Normalisation ------------------------------------------------------------------------

// Per-channel tensors of x: parameters (gamma, beta: bf16 working copies under bf16) and
// statistics (save_mean, save_invstd, running_mean, running_var: f32 always).
void check_bn_params(const Check& ck, const Tensor& x,
                     std::initializer_list<std::pair<const char*, const Tensor*>> ps) {
  ck.tensor("x", x);
  ck.rank("x", x, 4);
  for (auto& [name, t] : ps) {
    const std::string_view n(name);
    if (n == "gamma" || n == "beta")
      ck.tensor(name, *t);
    else
      ck.statistics(name, *t);
    ck.shape(name, *t, Shape{x.size(1)});
  }
}

void check_batchnorm2d_forward_train(const Check& ck, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                     const Tensor& running_mean, const Tensor& running_var, const BatchNormParams& p,
                                     bool update_running, const Tensor& y, const Tensor& save_mean,
                                     const Tensor& save_invstd) {
  check_bn_params(ck, x,
                  {{"gamma", &gamma}, {"beta", &beta}, {"save_mean", &save_mean}, {"save_invstd", &save_invstd}});
  if (update_running) check_bn_params(ck, x, {{"running_mean", &running_mean}, {"running_var", &running_var}});
  ck.tensor("y", y);
  ck.same_shape("x", x, "y", y);
  if (x.size(0) * x.size(2) * x.size(3) < 2 && update_running)
    ck.fail("x " + x.str() + ": batch statistics need more than one value per channel");
}

void check_batchnorm2d_forward_eval(const Check& ck, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                    const Tensor& running_mean, const Tensor& running_var, const BatchNormParams& p,
                                    const Tensor& y) {
  check_bn_params(ck, x,
                  {{"gamma", &gamma}, {"beta", &beta}, {"running_mean", &running_mean}, {"running_var", &running_var}});
  ck.tensor("y", y);
  ck.same_shape("x", x, "y", y);
}

void check_batchnorm2d_backward(const Check& ck, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                const Tensor& save_mean, const Tensor& save_invstd, const Tensor& dx,
                                const Tensor& dgamma, const Tensor& dbeta) {
  check_bn_params(ck, x, {{"gamma", &gamma}, {"save_mean", &save_mean}, {"save_invstd", &save_invstd}});
  ck.tensor("dy", dy);
  ck.same_shape("dy", dy, "x", x);
  ck.optional("dx", dx, x.shape());
  ck.optional("dgamma", dgamma, Shape{x.size(1)});
  ck.optional("dbeta", dbeta, Shape{x.size(1)});
}

void check_layernorm_forward(const Check& ck, const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                             const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  ck.tensor("x", x);
  ck.min_rank("x", x, 1);
  const int64_t c = x.size(-1), n = rows_of(x.shape());
  ck.tensor("gamma", gamma);
  ck.shape("gamma", gamma, Shape{c});
  ck.tensor("beta", beta);
  ck.shape("beta", beta, Shape{c});
  ck.tensor("y", y);
  ck.same_shape("x", x, "y", y);
  ck.statistics("mean", mean);
  ck.shape("mean", mean, Shape{n});
  ck.statistics("rstd", rstd);
  ck.shape("rstd", rstd, Shape{n});
  if (!(eps > 0.0f)) ck.fail("eps must be positive");
}

void check_layernorm_backward_workspace(const Check& ck, const Shape& x) {
  if (x.rank() < 1) ck.fail("x " + x.str() + " must have rank >= 1");
}

void check_layernorm_backward(const Check& ck, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                              const Tensor& mean, const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,
                              const Tensor& dbeta, const Tensor& workspace) {
  ck.tensor("x", x);
  ck.min_rank("x", x, 1);
  const int64_t c = x.size(-1), n = rows_of(x.shape());
  ck.tensor("dy", dy);
  ck.same_shape("dy", dy, "x", x);
  ck.tensor("gamma", gamma);
  ck.shape("gamma", gamma, Shape{c});
  ck.statistics("mean", mean);
  ck.shape("mean", mean, Shape{n});
  ck.statistics("rstd", rstd);
  ck.shape("rstd", rstd, Shape{n});
  ck.optional("dx", dx, x.shape());
  ck.optional("dgamma", dgamma, Shape{c});
  ck.optional("dbeta", dbeta, Shape{c});
  if (dgamma.defined() || dbeta.defined()) ck.workspace(workspace, ck.be->layernorm_backward_workspace(x.shape()));
}

void check_rmsnorm_forward(const Check& ck, const Tensor& x, const Tensor& gamma, float eps, const Tensor& y,
                           const Tensor& rstd) {
  ck.tensor("x", x);
  ck.min_rank("x", x, 1);
  ck.tensor("gamma", gamma);
  ck.shape("gamma", gamma, Shape{x.size(-1)});
  ck.tensor("y", y);
  ck.same_shape("x", x, "y", y);
  ck.statistics("rstd", rstd);
  ck.shape("rstd", rstd, Shape{rows_of(x.shape())});
  if (!(eps > 0.0f)) ck.fail("eps must be positive");
}

void check_rmsnorm_backward(const Check& ck, const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                            const Tensor& dx, const Tensor& dgamma) {
  ck.tensor("x", x);
  ck.min_rank("x", x, 1);
  ck.tensor("dy", dy);
  ck.same_shape("dy", dy, "x", x);
  ck.tensor("gamma", gamma);
  ck.shape("gamma", gamma, Shape{x.size(-1)});
  ck.statistics("rstd", rstd);
  ck.shape("rstd", rstd, Shape{rows_of(x.shape())});
  ck.optional("dx", dx, x.shape());
  ck.optional("dgamma", dgamma, Shape{x.size(-1)});
}

// ---- Transformer pieces ---------------------------------------------------------------------

void check_embedding_forward(const Check& ck, const Tensor& ids, const Tensor& table, const Tensor& pos_table,
                             const Tensor& y) {
  ck.tensor("ids", ids, DType::i32);
  ck.rank("ids", ids, 2);
  ck.tensor("table", table);
  ck.rank("table", table, 2);
  ck.tensor("y", y);
  ck.shape("y", y, Shape{ids.size(0), ids.size(1), table.size(1)});
  if (pos_table.defined()) {
    ck.tensor("pos_table", pos_table);
    ck.rank("pos_table", pos_table, 2);
    if (pos_table.size(1) != table.size(1) || pos_table.size(0) < ids.size(1))
      ck.fail("pos_table " + pos_table.str() + " must be [Tmax >= " + std::to_string(ids.size(1)) + ", " +
              std::to_string(table.size(1)) + "]");
  }
}

void check_embedding_backward_workspace(const Check& ck, const Shape& dy) {
  if (dy.rank() != 3) ck.fail("dy " + dy.str() + " must be [B, T, C]");
}

void check_embedding_backward(const Check& ck, const Tensor& dy, const Tensor& ids, const Tensor& dtable,
                              const Tensor& dpos_table, const Tensor& workspace) {
  ck.tensor("ids", ids, DType::i32);
  ck.rank("ids", ids, 2);
  ck.tensor("dy", dy);
  ck.rank("dy", dy, 3);
  if (dy.size(0) != ids.size(0) || dy.size(1) != ids.size(1))
    ck.fail("dy " + dy.str() + " does not match ids " + ids.str());
  if (dtable.defined()) {
    ck.tensor("dtable", dtable);
    ck.rank("dtable", dtable, 2);
    if (dtable.size(1) != dy.size(2)) ck.fail("dtable " + dtable.str() + " and dy " + dy.str() + ": widths differ");
    ck.workspace(workspace, ck.be->embedding_backward_workspace(dy.shape()));
  }
  if (dpos_table.defined()) {
    ck.tensor("dpos_table", dpos_table);
    ck.rank("dpos_table", dpos_table, 2);
    if (dpos_table.size(1) != dy.size(2) || dpos_table.size(0) < dy.size(1))
      ck.fail("dpos_table " + dpos_table.str() + " does not fit dy " + dy.str());
  }
}

void check_attention_forward_workspace(const Check& ck, const Shape& qkv, const AttentionParams& p) {
  check_attention(ck, qkv, p);
}

void check_attention_forward(const Check& ck, const Tensor& qkv, const AttentionParams& p, RngState rng,
                             const Tensor& out, const Tensor& probs, const Tensor& workspace) {
  ck.tensor("qkv", qkv);
  check_attention(ck, qkv.shape(), p);
  const int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3;
  if (out.defined()) {  // undefined: the probabilities only
    ck.tensor("out", out);
    ck.shape("out", out, Shape{b, t, c});
  }
  ck.tensor("probs", probs);
  ck.shape("probs", probs, Shape{b, p.n_head, t, t});
  if (out.defined() && (out.shares_storage(qkv) || out.shares_storage(probs)))
    ck.fail("qkv, out and probs must not share storage");
  if (probs.shares_storage(qkv)) ck.fail("qkv, out and probs must not share storage");
  ck.workspace(workspace, ck.be->attention_forward_workspace(qkv.shape(), p));
}

void check_attention_backward_workspace(const Check& ck, const Shape& qkv, const AttentionParams& p) {
  check_attention(ck, qkv, p);
}

void check_attention_backward(const Check& ck, const Tensor& dout, const Tensor& qkv, const Tensor& probs,
                              const AttentionParams& p, RngState rng, const Tensor& dqkv, const Tensor& workspace) {
  ck.tensor("qkv", qkv);
  check_attention(ck, qkv.shape(), p);
  const int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3;
  ck.tensor("dout", dout);
  ck.shape("dout", dout, Shape{b, t, c});
  ck.tensor("probs", probs);
  ck.shape("probs", probs, Shape{b, p.n_head, t, t});
  ck.tensor("dqkv", dqkv);
  ck.same_shape("dqkv", dqkv, "qkv", qkv);
  if (dqkv.shares_storage(qkv) || dqkv.shares_storage(dout) || dqkv.shares_storage(probs))
    ck.fail("dqkv must not share storage with qkv, dout or probs");
  ck.workspace(workspace, ck.be->attention_backward_workspace(qkv.shape(), p));
}

void check_permute_0213(const Check& ck, const Tensor& x, const Tensor& y) {
  ck.tensor("x", x);
  ck.tensor("y", y);
  ck.rank("x", x, 4);
  ck.shape("y", y, Shape{x.size(0), x.size(2), x.size(1), x.size(3)});
  if (x.dtype() != y.dtype())
    ck.fail("x " + x.str() + " and y " + y.str() + ": a permutation copies elements, so x and y need one dtype");
  if (x.shares_storage(y)) ck.fail("x and y must not share storage");
}

// ---- Optimizers --------------------------------------------------------------------------------

void check_sgd_step(const Check& ck, const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
                    const SgdParams& p, int64_t step) {
  ck.tensor("param", param);
  ck.tensor("grad", grad);
  ck.same_shape("param", param, "grad", grad);
  if (p.momentum != 0.0) {
    ck.tensor("momentum_buf", momentum_buf);
    ck.same_shape("param", param, "momentum_buf", momentum_buf);
  }
  if (step < 1) ck.fail("step counts from 1, got " + std::to_string(step));
  if (p.nesterov && (p.momentum <= 0.0 || p.dampening != 0.0))
    ck.fail("Nesterov momentum requires a momentum and zero dampening");
}

void check_sgd_step_multi(const Check& ck, const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                          const std::vector<Tensor>& momentum_bufs, const std::vector<SgdParams>& p, int64_t step) {
  const size_t n = params.size();
  if (grads.size() != n || momentum_bufs.size() != n || p.size() != n)
    ck.fail(std::to_string(n) + " params but " + std::to_string(grads.size()) + " grads, " +
            std::to_string(momentum_bufs.size()) + " momentum_bufs and " + std::to_string(p.size()) +
            " hyperparameter sets");
  for (size_t i = 0; i < n; ++i) check_sgd_step(ck, params[i], grads[i], momentum_bufs[i], p[i], step);
  if (step < 1) ck.fail("step counts from 1, got " + std::to_string(step));
}

void check_adamw_step(const Check& ck, const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                      const Tensor& exp_avg_sq, const AdamWParams& p, int64_t step) {
  ck.tensor("param", param);
  ck.tensor("grad", grad);
  ck.tensor("exp_avg", exp_avg);
  ck.tensor("exp_avg_sq", exp_avg_sq);
  ck.same_shape("param", param, "grad", grad);
  ck.same_shape("param", param, "exp_avg", exp_avg);
  ck.same_shape("param", param, "exp_avg_sq", exp_avg_sq);
  if (step < 1) ck.fail("step counts from 1, got " + std::to_string(step));
  if (!(p.beta1 >= 0.0 && p.beta1 < 1.0 && p.beta2 >= 0.0 && p.beta2 < 1.0)) ck.fail("betas must be in [0, 1)");
}

void check_adamw_step_multi(const Check& ck, const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                            const std::vector<Tensor>& exp_avgs, const std::vector<Tensor>& exp_avg_sqs,
                            const std::vector<AdamWParams>& p, int64_t step) {
  const size_t n = params.size();
  if (grads.size() != n || exp_avgs.size() != n || exp_avg_sqs.size() != n || p.size() != n)
    ck.fail(std::to_string(n) + " params but " + std::to_string(grads.size()) + " grads, " +
            std::to_string(exp_avgs.size()) + " exp_avgs, " + std::to_string(exp_avg_sqs.size()) + " exp_avg_sqs and " +
            std::to_string(p.size()) + " hyperparameter sets");
  for (size_t i = 0; i < n; ++i) check_adamw_step(ck, params[i], grads[i], exp_avgs[i], exp_avg_sqs[i], p[i], step);
  if (step < 1) ck.fail("step counts from 1, got " + std::to_string(step));
}

void check_cast_multi(const Check& ck, const std::vector<Tensor>& src, const std::vector<Tensor>& dst) {
  if (src.size() != dst.size())
    ck.fail(std::to_string(src.size()) + " sources but " + std::to_string(dst.size()) + " destinations");
  for (size_t i = 0; i < src.size(); ++i) {
    // Any float dtype on either side, whatever activation_dtype() says: converting is the op.
    for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"src", &src[i]}, {"dst", &dst[i]}}) {
      if (!t->defined()) ck.fail(std::string(name) + " " + std::to_string(i) + " is undefined");
      if (t->dtype() != DType::f32 && t->dtype() != DType::bf16)
        ck.fail(std::string(name) + " " + std::to_string(i) + " " + t->str() + ": expected dtype f32 or bf16");
      if (t->device() != ck.device)
        ck.fail(std::string(name) + " " + std::to_string(i) + " " + t->str() + ": expected a tensor on " +
                ck.device.str());
    }
    if (src[i].shape() != dst[i].shape())
      ck.fail("src " + std::to_string(i) + " " + src[i].str() + " and dst " + dst[i].str() +
              " must have the same shape");
    if (src[i].shares_storage(dst[i]))
      ck.fail("src " + std::to_string(i) + " " + src[i].str() + " and dst " + dst[i].str() + " must not share storage");
  }
}

void check_global_norm(const Check& ck, const std::vector<Tensor>& tensors) {
  for (const auto& t : tensors) ck.tensor("tensor", t);
}

void check_clip_grad_norm(const Check& ck, const std::vector<Tensor>& tensors, double max_norm) {
  for (const auto& t : tensors) ck.tensor("tensor", t);
  if (!(max_norm > 0.0)) ck.fail("max_norm must be positive, got " + std::to_string(max_norm));
}

#pragma GCC diagnostic pop

}  // namespace

// ---- The public ops: validate, enter the backend, run --------------------------------------

#define REMAT_ARGS(...) __VA_ARGS__
// The name errors give: the op's, or for a workspace query the op it sizes.
#define REMAT_OP_NAME_op(name) std::string_view(#name)
#define REMAT_OP_NAME_result(name) std::string_view(#name)
#define REMAT_OP_NAME_workspace(name) std::string_view(#name, sizeof(#name) - sizeof("_workspace"))
#define REMAT_OP(kind, R, name, params, args)                                         \
  R Backend::name params {                                                            \
    check_##name(Check{REMAT_OP_NAME_##kind(name), device(), this}, REMAT_ARGS args); \
    enter_op();                                                                       \
    return name##_impl args;                                                          \
  }
#include "remat/backend_ops.def"
#undef REMAT_OP
#undef REMAT_ARGS

}  // namespace remat
