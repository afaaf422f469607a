// Validators of the 2-D convolution and its workspace queries (src/backends/cpu/conv.cpp), and
// the output shape every backend and the ops wrappers share.
#include "backends/validate/check.h"

namespace remat::validate {

namespace {

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

}  // namespace

}  // namespace remat::validate

namespace remat {

// Shared by every backend and the ops wrappers (remat/backend.h).
Shape conv2d_output_shape(const Shape& x, const Shape& w, const Conv2dParams& p) {
  validate::check_conv(validate::Check{"conv2d", Device::cpu()}, x, w, p);
  const int64_t ph = (x[2] + 2 * p.pad_h - int64_t{p.dilation_h} * (w[2] - 1) - 1) / p.stride_h + 1;
  const int64_t pw = (x[3] + 2 * p.pad_w - int64_t{p.dilation_w} * (w[3] - 1) - 1) / p.stride_w + 1;
  return Shape{x[0], w[0], ph, pw};
}

}  // namespace remat

namespace remat::validate {

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

}  // namespace remat::validate
