// PLACEHOLDER: replaced by the real implementation before this lands.
#include "backends/cpu/cpu_backend.h"
#include "remat/error.h"

namespace remat {

size_t CpuBackend::conv2d_forward_workspace_impl(const Shape&, const Shape&, const Conv2dParams&) {
  REMAT_THROW("cpu conv2d_forward_workspace_impl: not implemented yet");
}

void CpuBackend::conv2d_forward_impl(const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&, const Tensor&, const Tensor&) {
  REMAT_THROW("cpu conv2d_forward_impl: not implemented yet");
}

size_t CpuBackend::conv2d_backward_workspace_impl(const Shape&, const Shape&, const Conv2dParams&) {
  REMAT_THROW("cpu conv2d_backward_workspace_impl: not implemented yet");
}

void CpuBackend::conv2d_backward_impl(const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  REMAT_THROW("cpu conv2d_backward_impl: not implemented yet");
}

}  // namespace remat
