// PLACEHOLDER: replaced by the real implementation before this lands.
#include "backends/cpu/cpu_backend.h"
#include "remat/error.h"

namespace remat {

void CpuBackend::layernorm_forward_impl(const Tensor&, const Tensor&, const Tensor&, float, const Tensor&, const Tensor&, const Tensor&) {
  REMAT_THROW("cpu layernorm_forward_impl: not implemented yet");
}

void CpuBackend::layernorm_backward_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  REMAT_THROW("cpu layernorm_backward_impl: not implemented yet");
}

}  // namespace remat
