// RMS normalisation over the last dimension (kernels/rmsnorm.cu). Backward computes
// dgamma before dx, as the CPU does, so dx may alias dy.
#include "kernels/rmsnorm.cuh"
#include "backends/cuda/cuda_backend.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

void CudaBackend::rmsnorm_forward_impl(const Tensor& x, const Tensor& gamma, float eps, const Tensor& y,
                                       const Tensor& rstd) {
  kernels::rmsnorm_forward(x.f32(), gamma.f32(), rstd.numel(), x.size(-1), eps, y.f32(), rstd.f32(), stream());
}

void CudaBackend::rmsnorm_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                                        const Tensor& dx, const Tensor& dgamma) {
  const int64_t n = rstd.numel(), c = x.size(-1);
  if (dgamma.defined()) kernels::rmsnorm_dgamma(dy.f32(), x.f32(), rstd.f32(), n, c, dgamma.f32(), stream());
  if (dx.defined()) kernels::rmsnorm_backward_dx(dy.f32(), x.f32(), gamma.f32(), rstd.f32(), n, c, dx.f32(), stream());
}

REMAT_KERNELS_ABI_END
}  // namespace remat
