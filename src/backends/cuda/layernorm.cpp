// Layer normalisation over the last dimension (kernels/layernorm.cu).
//
// Backward computes dgamma/dbeta before dx, as the CPU does, so dx may alias dy or x. The
// column sums for dgamma/dbeta go through the backend's scratch buffer in chunks of rows
// (no workspace is part of this op's interface). x, gamma, beta, y, dy and dx may be bf16
// (fbuf); mean, rstd, dgamma and dbeta are f32.
#include "kernels/layernorm.cuh"
#include "backends/cuda/cuda_backend.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

void CudaBackend::layernorm_forward_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                                         const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  kernels::layernorm_forward(fbuf(x), fbuf(gamma), fbuf(beta), mean.numel(), x.size(-1), eps, fbuf(y), mean.f32(),
                             rstd.f32(), stream());
}

void CudaBackend::layernorm_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                          const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,
                                          const Tensor& dbeta) {
  const int64_t n = mean.numel(), c = x.size(-1);
  kernels::layernorm_param_grads(fbuf(dy), fbuf(x), mean.f32(), rstd.f32(), n, c,
                                 dgamma.defined() ? dgamma.f32() : nullptr, dbeta.defined() ? dbeta.f32() : nullptr,
                                 static_cast<double*>(scratch()), kScratchBytes, stream());
  if (dx.defined())
    kernels::layernorm_backward_dx(fbuf(dy), fbuf(x), fbuf(gamma), mean.f32(), rstd.f32(), n, c, fbuf(dx), stream());
}

REMAT_KERNELS_ABI_END
}  // namespace remat
