// STUB: replaced by the layernorm family (kernels + host glue).
#include "backends/cuda/cuda_backend.h"
#include "remat/error.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

void CudaBackend::layernorm_forward_impl(const Tensor& /*x*/, const Tensor& /*gamma*/, const Tensor& /*beta*/, float /*eps*/, const Tensor& /*y*/, const Tensor& /*mean*/, const Tensor& /*rstd*/) {
  throw Unsupported("layernorm_forward: not implemented on " + name() + " yet");
}

void CudaBackend::layernorm_backward_impl(const Tensor& /*dy*/, const Tensor& /*x*/, const Tensor& /*gamma*/, const Tensor& /*mean*/, const Tensor& /*rstd*/, const Tensor& /*dx*/, const Tensor& /*dgamma*/, const Tensor& /*dbeta*/) {
  throw Unsupported("layernorm_backward: not implemented on " + name() + " yet");
}

REMAT_KERNELS_ABI_END
}  // namespace remat
