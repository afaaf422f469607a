// Layer normalisation over the last dimension (kernels/layernorm.cu).
//
// Backward computes dgamma/dbeta before dx, as the CPU does, so dx may alias dy or x. The
// column sums for dgamma/dbeta go through the backend's scratch buffer in chunks of rows
// (no workspace is part of this op's interface).
#include "kernels/layernorm.cuh"
#include "backends/cuda/cuda_backend.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

void CudaBackend::layernorm_forward_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                                         const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  kernels::layernorm_forward(x.f32(), gamma.f32(), beta.f32(), mean.numel(), x.size(-1), eps, y.f32(), mean.f32(),
                             rstd.f32(), stream());
}

void CudaBackend::layernorm_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                          const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,
                                          const Tensor& dbeta) {
  const int64_t n = mean.numel(), c = x.size(-1);
  kernels::layernorm_param_grads(dy.f32(), x.f32(), mean.f32(), rstd.f32(), n, c,
                                 dgamma.defined() ? dgamma.f32() : nullptr, dbeta.defined() ? dbeta.f32() : nullptr,
                                 static_cast<double*>(scratch()), kScratchBytes, stream());
  if (dx.defined())
    kernels::layernorm_backward_dx(dy.f32(), x.f32(), gamma.f32(), mean.f32(), rstd.f32(), n, c, dx.f32(), stream());
}

REMAT_KERNELS_ABI_END
}  // namespace remat
