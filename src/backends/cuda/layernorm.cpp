// Layer normalisation over the last dimension (kernels/layernorm.cu).
//
// Backward computes dgamma/dbeta before dx, as the CPU does, so dx may alias dy or x. The
// column sums for dgamma/dbeta go by chunks of rows whose sums (double) are in the op's
// workspace (layernorm_param_grads_workspace: chunks x 2 c doubles, enough chunks for about
// 512 blocks). x, gamma, beta, y, dy and dx may be bf16 (fbuf); mean, rstd, dgamma and
// dbeta are f32.
#include "kernels/layernorm.cuh"
#include "backends/cuda/cuda_backend.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

void CudaBackend::layernorm_forward_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                         const LayerNormParams& p, const Tensor& y, const Tensor& mean,
                                         const Tensor& rstd) {
  kernels::layernorm_forward(fbuf(x), fbuf(gamma), fbuf(beta), mean.numel(), x.size(-1), p.eps, fbuf(y), mean.f32(),
                             rstd.f32(), stream());
}

size_t CudaBackend::layernorm_backward_workspace_impl(const Shape& x) {
  return kernels::layernorm_param_grads_workspace(x.numel() / std::max<int64_t>(x[-1], 1), x[-1]);
}

void CudaBackend::layernorm_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                          const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,
                                          const Tensor& dbeta, const Tensor& workspace) {
  const int64_t n = mean.numel(), c = x.size(-1);
  // The validator checked the workspace's size when dgamma or dbeta is defined.
  double* partial = workspace.defined() ? static_cast<double*>(workspace.raw_data()) : nullptr;
  kernels::layernorm_param_grads(fbuf(dy), fbuf(x), mean.f32(), rstd.f32(), n, c,
                                 dgamma.defined() ? dgamma.f32() : nullptr, dbeta.defined() ? dbeta.f32() : nullptr,
                                 partial, stream());
  if (dx.defined())
    kernels::layernorm_backward_dx(fbuf(dy), fbuf(x), fbuf(gamma), mean.f32(), rstd.f32(), n, c, fbuf(dx), stream());
}

REMAT_KERNELS_ABI_END
}  // namespace remat
