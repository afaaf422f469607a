// BatchNorm2d on the CUDA backend (kernels/batchnorm.cu), PyTorch's formulas as the CPU
// backend. The per-channel partial sums of a launch live in the backend's scratch buffer
// (stream-ordered, so no other op sees them); nothing is allocated. x, gamma, beta, y, dy
// and dx may be bf16 (fbuf); the statistics and parameter gradients are f32.
#include "kernels/batchnorm.cuh"
#include "backends/cuda/cuda_backend.h"
#include "remat/error.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

namespace {

kernels::BatchNormShape bn_shape(const Tensor& x) { return {x.size(0), x.size(1), x.size(2) * x.size(3)}; }

float* f32_or_null(const Tensor& t) { return t.defined() ? t.f32() : nullptr; }

}  // namespace

void CudaBackend::batchnorm2d_forward_train_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                                 const Tensor& running_mean, const Tensor& running_var,
                                                 const BatchNormParams& p, bool update_running, const Tensor& y,
                                                 const Tensor& save_mean, const Tensor& save_invstd) {
  kernels::batchnorm_forward_train(fbuf(x), fbuf(gamma), fbuf(beta), bn_shape(x), p.momentum, p.eps,
                                   update_running ? running_mean.f32() : nullptr,
                                   update_running ? running_var.f32() : nullptr, fbuf(y), save_mean.f32(),
                                   save_invstd.f32(), scratch(), kScratchBytes, stream_);
}

void CudaBackend::batchnorm2d_forward_eval_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                                const Tensor& running_mean, const Tensor& running_var,
                                                const BatchNormParams& p, const Tensor& y) {
  kernels::batchnorm_forward_eval(fbuf(x), fbuf(gamma), fbuf(beta), running_mean.f32(), running_var.f32(), bn_shape(x),
                                  p.eps, fbuf(y), stream_);
}

void CudaBackend::batchnorm2d_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                            const Tensor& save_mean, const Tensor& save_invstd, const Tensor& dx,
                                            const Tensor& dgamma, const Tensor& dbeta) {
  kernels::batchnorm_backward(fbuf(dy), fbuf(x), fbuf(gamma), save_mean.f32(), save_invstd.f32(), bn_shape(x), fbuf(dx),
                              f32_or_null(dgamma), f32_or_null(dbeta), scratch(), kScratchBytes, stream_);
}

REMAT_KERNELS_ABI_END
}  // namespace remat
