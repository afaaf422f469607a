// RMS normalisation over the last dimension (kernels/rmsnorm.cu). Backward computes
// dgamma before dx, as the CPU does, so dx may alias dy. x, gamma, y, dy and dx may be
// bf16 (fbuf); rstd and dgamma are f32.
#include "kernels/rmsnorm.cuh"
#include "backends/cuda/cuda_backend.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

void CudaBackend::rmsnorm_forward_impl(const Tensor& x, const Tensor& gamma, const RmsNormParams& p, const Tensor& y,
                                       const Tensor& rstd) {
  kernels::rmsnorm_forward(fbuf(x), fbuf(gamma), rstd.numel(), x.size(-1), p.eps, fbuf(y), rstd.f32(), stream());
}

void CudaBackend::rmsnorm_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                                        const Tensor& dx, const Tensor& dgamma) {
  const int64_t n = rstd.numel(), c = x.size(-1);
  if (dgamma.defined()) kernels::rmsnorm_dgamma(fbuf(dy), fbuf(x), rstd.f32(), n, c, dgamma.f32(), stream());
  if (dx.defined()) kernels::rmsnorm_backward_dx(fbuf(dy), fbuf(x), fbuf(gamma), rstd.f32(), n, c, fbuf(dx), stream());
}

REMAT_KERNELS_ABI_END
}  // namespace remat
