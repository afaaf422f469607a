// PLACEHOLDER: replaced by the real implementation before this lands.
#include "backends/cpu/cpu_backend.h"
#include "remat/error.h"

namespace remat {

void CpuBackend::softmax_forward_impl(const Tensor&, bool, const Tensor&) {
  REMAT_THROW("cpu softmax_forward_impl: not implemented yet");
}

void CpuBackend::softmax_backward_impl(const Tensor&, const Tensor&, bool, const Tensor&) {
  REMAT_THROW("cpu softmax_backward_impl: not implemented yet");
}

void CpuBackend::cross_entropy_forward_impl(const Tensor&, const Tensor&, int, const Tensor&, const Tensor&) {
  REMAT_THROW("cpu cross_entropy_forward_impl: not implemented yet");
}

void CpuBackend::cross_entropy_backward_impl(float, const Tensor&, const Tensor&, const Tensor&, int, const Tensor&) {
  REMAT_THROW("cpu cross_entropy_backward_impl: not implemented yet");
}

int64_t CpuBackend::accuracy_impl(const Tensor&, const Tensor&, int, int64_t*) {
  REMAT_THROW("cpu accuracy_impl: not implemented yet");
}

}  // namespace remat
