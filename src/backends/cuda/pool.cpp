// Pooling on the CUDA backend (kernels/pool.cu): max, average (count_include_pad) and
// global average pooling, NCHW. Max and average pooling reproduce the CPU backend's bits,
// on f32 and on bf16 tensors (fbuf: fp32 math, bf16 outputs rounded once); indices are u8
// window offsets.
#include <limits>

#include "backends/cuda/cuda_backend.h"
#include "kernels/pool.cuh"
#include "remat/error.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

namespace {

kernels::PoolShape pool_shape(const Shape& x, const Shape& y, const Pool2dParams& p) {
  return kernels::PoolShape{x[0] * x[1], x[2],       x[3],       y[2],    y[3],   p.kernel_h,
                            p.kernel_w,  p.stride_h, p.stride_w, p.pad_h, p.pad_w};
}

}  // namespace

void CudaBackend::maxpool2d_forward_impl(const Tensor& x, const Pool2dParams& p, const Tensor& y,
                                         const Tensor& indices) {
  kernels::maxpool2d_forward(fbuf(x), pool_shape(x.shape(), y.shape(), p), fbuf(y), indices.u8(), stream_);
}

// Offsets outside the window or on its padding are skipped here (the CPU backend reports
// them): checking them would cost a synchronisation per call, and maxpool2d_forward never
// writes one.
void CudaBackend::maxpool2d_backward_impl(const Tensor& dy, const Tensor& indices, const Pool2dParams& p,
                                          const Tensor& dx) {
  // The kernel's per-lane targets are i32 positions in the plane.
  REMAT_CHECK(dx.size(2) * dx.size(3) <= std::numeric_limits<int32_t>::max(), "maxpool2d_backward: dx ", dx.str(),
              ": a plane is too large");
  kernels::maxpool2d_backward(fbuf(dy), indices.u8(), pool_shape(dx.shape(), dy.shape(), p), fbuf(dx), stream_);
}

void CudaBackend::avgpool2d_forward_impl(const Tensor& x, const Pool2dParams& p, const Tensor& y) {
  kernels::avgpool2d_forward(fbuf(x), pool_shape(x.shape(), y.shape(), p), fbuf(y), stream_);
}

void CudaBackend::avgpool2d_backward_impl(const Tensor& dy, const Pool2dParams& p, const Tensor& dx) {
  kernels::avgpool2d_backward(fbuf(dy), pool_shape(dx.shape(), dy.shape(), p), fbuf(dx), stream_);
}

void CudaBackend::global_avgpool_forward_impl(const Tensor& x, const Tensor& y) {
  kernels::global_avgpool_forward(fbuf(x), x.size(0) * x.size(1), x.size(2) * x.size(3), fbuf(y), stream_);
}

void CudaBackend::global_avgpool_backward_impl(const Tensor& dy, const Tensor& dx) {
  kernels::global_avgpool_backward(fbuf(dy), dx.size(0) * dx.size(1), dx.size(2) * dx.size(3), fbuf(dx), stream_);
}

REMAT_KERNELS_ABI_END
}  // namespace remat
