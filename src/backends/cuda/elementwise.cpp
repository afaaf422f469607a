// Elementwise ops on the CUDA backend: add, accumulate, scale, ReLU, GELU, dropout
// (kernels/elementwise.cu, kernels/dropout.cu). Outputs may alias inputs where the CPU
// backend allows it (scale in place, backward into dy). Any array may be bf16 (fbuf): fp32
// math, bf16 outputs rounded once, so a bf16 result is the fp32 op's on the same values,
// rounded (the CPU backend's contract, src/backends/cpu/mixed.h).
#include "kernels/elementwise.cuh"
#include "backends/cuda/cuda_backend.h"
#include "kernels/dropout.cuh"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

namespace {
kernels::Gelu gelu_form(GeluApprox approx) {
  return approx == GeluApprox::tanh ? kernels::Gelu::tanh : kernels::Gelu::erf;
}
}  // namespace

void CudaBackend::add_impl(const Tensor& a, const Tensor& b, const Tensor& y) {
  kernels::add(fbuf(a), fbuf(b), fbuf(y), y.numel(), stream_);
}

void CudaBackend::accumulate_impl(const Tensor& dst, const Tensor& src) {
  kernels::add(fbuf(dst), fbuf(src), fbuf(dst), dst.numel(), stream_);
}

void CudaBackend::scale_impl(const Tensor& x, float alpha, const Tensor& y) {
  kernels::scale(fbuf(x), alpha, fbuf(y), y.numel(), stream_);
}

void CudaBackend::relu_forward_impl(const Tensor& x, const Tensor& y) {
  kernels::relu_forward(fbuf(x), fbuf(y), y.numel(), stream_);
}

void CudaBackend::relu_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  kernels::relu_backward(fbuf(dy), fbuf(x), fbuf(dx), dx.numel(), stream_);
}

void CudaBackend::gelu_forward_impl(const Tensor& x, GeluApprox approx, const Tensor& y) {
  kernels::gelu_forward(fbuf(x), gelu_form(approx), fbuf(y), y.numel(), stream_);
}

void CudaBackend::gelu_backward_impl(const Tensor& dy, const Tensor& x, GeluApprox approx, const Tensor& dx) {
  kernels::gelu_backward(fbuf(dy), fbuf(x), gelu_form(approx), fbuf(dx), dx.numel(), stream_);
}

void CudaBackend::dropout_forward_impl(const Tensor& x, float p, RngState rng, const Tensor& y) {
  kernels::dropout(fbuf(x), fbuf(y), y.numel(), p, rng.seed, rng.offset, stream_);
}

void CudaBackend::dropout_backward_impl(const Tensor& dy, float p, RngState rng, const Tensor& dx) {
  kernels::dropout(fbuf(dy), fbuf(dx), dx.numel(), p, rng.seed, rng.offset, stream_);
}

REMAT_KERNELS_ABI_END
}  // namespace remat
