// STUB: replaced by the optim family (kernels + host glue).
#include "backends/cuda/cuda_backend.h"
#include "remat/error.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

void CudaBackend::sgd_step_impl(const Tensor& /*param*/, const Tensor& /*grad*/, const Tensor& /*momentum_buf*/, const SgdParams& /*p*/, int64_t /*step*/) {
  throw Unsupported("sgd_step: not implemented on " + name() + " yet");
}

void CudaBackend::adamw_step_impl(const Tensor& /*param*/, const Tensor& /*grad*/, const Tensor& /*exp_avg*/, const Tensor& /*exp_avg_sq*/, const AdamWParams& /*p*/, int64_t /*step*/) {
  throw Unsupported("adamw_step: not implemented on " + name() + " yet");
}

double CudaBackend::global_norm_impl(const std::vector<Tensor>& /*tensors*/) {
  throw Unsupported("global_norm: not implemented on " + name() + " yet");
}

REMAT_KERNELS_ABI_END
}  // namespace remat
