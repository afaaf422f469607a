// PLACEHOLDER: replaced by the real implementation before this lands.
#include "backends/cpu/cpu_backend.h"
#include "remat/error.h"

namespace remat {

void CpuBackend::gemm_impl(const Tensor&, const Tensor&, const Tensor&, const GemmParams&) {
  REMAT_THROW("cpu gemm_impl: not implemented yet");
}

void CpuBackend::linear_forward_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  REMAT_THROW("cpu linear_forward_impl: not implemented yet");
}

void CpuBackend::linear_backward_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  REMAT_THROW("cpu linear_backward_impl: not implemented yet");
}

}  // namespace remat
