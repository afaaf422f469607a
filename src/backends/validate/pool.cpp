// Validators of max, average and global average pooling (src/backends/cpu/pool.cpp), and the
// output shape every backend and the ops wrappers share.
#include "backends/validate/check.h"

namespace remat::validate {

namespace {

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

}  // namespace

}  // namespace remat::validate

namespace remat {

// Shared by every backend and the ops wrappers (remat/backend.h).
Shape pool2d_output_shape(const Shape& x, const Pool2dParams& p) {
  validate::check_pool(validate::Check{"pool2d", Device::cpu()}, x, p);
  return Shape{x[0], x[1], (x[2] + 2 * p.pad_h - p.kernel_h) / p.stride_h + 1,
               (x[3] + 2 * p.pad_w - p.kernel_w) / p.stride_w + 1};
}

}  // namespace remat

namespace remat::validate {

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

}  // namespace remat::validate
