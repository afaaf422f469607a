// PLACEHOLDER: replaced by the real implementation before this lands.
#include "backends/cpu/cpu_backend.h"
#include "remat/error.h"

namespace remat {

void CpuBackend::maxpool2d_forward_impl(const Tensor&, const Pool2dParams&, const Tensor&, const Tensor&) {
  REMAT_THROW("cpu maxpool2d_forward_impl: not implemented yet");
}

void CpuBackend::maxpool2d_backward_impl(const Tensor&, const Tensor&, const Tensor&) {
  REMAT_THROW("cpu maxpool2d_backward_impl: not implemented yet");
}

void CpuBackend::avgpool2d_forward_impl(const Tensor&, const Pool2dParams&, const Tensor&) {
  REMAT_THROW("cpu avgpool2d_forward_impl: not implemented yet");
}

void CpuBackend::avgpool2d_backward_impl(const Tensor&, const Pool2dParams&, const Tensor&) {
  REMAT_THROW("cpu avgpool2d_backward_impl: not implemented yet");
}

void CpuBackend::global_avgpool_forward_impl(const Tensor&, const Tensor&) {
  REMAT_THROW("cpu global_avgpool_forward_impl: not implemented yet");
}

void CpuBackend::global_avgpool_backward_impl(const Tensor&, const Tensor&) {
  REMAT_THROW("cpu global_avgpool_backward_impl: not implemented yet");
}

}  // namespace remat
