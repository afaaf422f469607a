// Elementwise ops on the CUDA backend: add, accumulate, scale, ReLU, GELU, dropout
// (kernels/elementwise.cu, kernels/dropout.cu). Outputs may alias inputs where the CPU
// backend allows it (scale in place, backward into dy).
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
  kernels::add_f32(a.f32(), b.f32(), y.f32(), y.numel(), stream_);
}

void CudaBackend::accumulate_impl(const Tensor& dst, const Tensor& src) {
  kernels::add_f32(dst.f32(), src.f32(), dst.f32(), dst.numel(), stream_);
}

void CudaBackend::scale_impl(const Tensor& x, float alpha, const Tensor& y) {
  kernels::scale_f32(x.f32(), alpha, y.f32(), y.numel(), stream_);
}

void CudaBackend::relu_forward_impl(const Tensor& x, const Tensor& y) {
  kernels::relu_forward(x.f32(), y.f32(), y.numel(), stream_);
}

void CudaBackend::relu_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  kernels::relu_backward(dy.f32(), x.f32(), dx.f32(), dx.numel(), stream_);
}

void CudaBackend::gelu_forward_impl(const Tensor& x, GeluApprox approx, const Tensor& y) {
  kernels::gelu_forward(x.f32(), gelu_form(approx), y.f32(), y.numel(), stream_);
}

void CudaBackend::gelu_backward_impl(const Tensor& dy, const Tensor& x, GeluApprox approx, const Tensor& dx) {
  kernels::gelu_backward(dy.f32(), x.f32(), gelu_form(approx), dx.f32(), dx.numel(), stream_);
}

void CudaBackend::dropout_forward_impl(const Tensor& x, float p, RngState rng, const Tensor& y) {
  kernels::dropout(x.f32(), y.f32(), y.numel(), p, rng.seed, rng.offset, stream_);
}

void CudaBackend::dropout_backward_impl(const Tensor& dy, float p, RngState rng, const Tensor& dx) {
  kernels::dropout(dy.f32(), dx.f32(), dx.numel(), p, rng.seed, rng.offset, stream_);
}

REMAT_KERNELS_ABI_END
}  // namespace remat
