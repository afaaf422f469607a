// PLACEHOLDER: replaced by the real implementation before this lands.
#include "backends/cpu/cpu_backend.h"
#include "remat/error.h"

namespace remat {

void CpuBackend::embedding_forward_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  REMAT_THROW("cpu embedding_forward_impl: not implemented yet");
}

void CpuBackend::embedding_backward_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  REMAT_THROW("cpu embedding_backward_impl: not implemented yet");
}

}  // namespace remat
