// PLACEHOLDER: replaced by the real implementation before this lands.
#include "backends/cpu/cpu_backend.h"
#include "remat/error.h"

namespace remat {

void CpuBackend::batchnorm2d_forward_train_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const BatchNormParams&, bool, const Tensor&, const Tensor&, const Tensor&) {
  REMAT_THROW("cpu batchnorm2d_forward_train_impl: not implemented yet");
}

void CpuBackend::batchnorm2d_forward_eval_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const BatchNormParams&, const Tensor&) {
  REMAT_THROW("cpu batchnorm2d_forward_eval_impl: not implemented yet");
}

void CpuBackend::batchnorm2d_backward_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  REMAT_THROW("cpu batchnorm2d_backward_impl: not implemented yet");
}

}  // namespace remat
