// STUB: replaced by the batchnorm family (kernels + host glue).
#include "backends/cuda/cuda_backend.h"
#include "remat/error.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

void CudaBackend::batchnorm2d_forward_train_impl(const Tensor& /*x*/, const Tensor& /*gamma*/, const Tensor& /*beta*/, const Tensor& /*running_mean*/, const Tensor& /*running_var*/, const BatchNormParams& /*p*/, bool /*update_running*/, const Tensor& /*y*/, const Tensor& /*save_mean*/, const Tensor& /*save_invstd*/) {
  throw Unsupported("batchnorm2d_forward_train: not implemented on " + name() + " yet");
}

void CudaBackend::batchnorm2d_forward_eval_impl(const Tensor& /*x*/, const Tensor& /*gamma*/, const Tensor& /*beta*/, const Tensor& /*running_mean*/, const Tensor& /*running_var*/, const BatchNormParams& /*p*/, const Tensor& /*y*/) {
  throw Unsupported("batchnorm2d_forward_eval: not implemented on " + name() + " yet");
}

void CudaBackend::batchnorm2d_backward_impl(const Tensor& /*dy*/, const Tensor& /*x*/, const Tensor& /*gamma*/, const Tensor& /*save_mean*/, const Tensor& /*save_invstd*/, const Tensor& /*dx*/, const Tensor& /*dgamma*/, const Tensor& /*dbeta*/) {
  throw Unsupported("batchnorm2d_backward: not implemented on " + name() + " yet");
}

REMAT_KERNELS_ABI_END
}  // namespace remat
