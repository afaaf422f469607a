// PLACEHOLDER: replaced by the real implementation before this lands.
#include "backends/cpu/cpu_backend.h"
#include "remat/error.h"

namespace remat {

void CpuBackend::add_impl(const Tensor&, const Tensor&, const Tensor&) {
  REMAT_THROW("cpu add_impl: not implemented yet");
}

void CpuBackend::accumulate_impl(const Tensor&, const Tensor&) {
  REMAT_THROW("cpu accumulate_impl: not implemented yet");
}

void CpuBackend::scale_impl(const Tensor&, float, const Tensor&) {
  REMAT_THROW("cpu scale_impl: not implemented yet");
}

void CpuBackend::relu_forward_impl(const Tensor&, const Tensor&) {
  REMAT_THROW("cpu relu_forward_impl: not implemented yet");
}

void CpuBackend::relu_backward_impl(const Tensor&, const Tensor&, const Tensor&) {
  REMAT_THROW("cpu relu_backward_impl: not implemented yet");
}

void CpuBackend::gelu_forward_impl(const Tensor&, GeluApprox, const Tensor&) {
  REMAT_THROW("cpu gelu_forward_impl: not implemented yet");
}

void CpuBackend::gelu_backward_impl(const Tensor&, const Tensor&, GeluApprox, const Tensor&) {
  REMAT_THROW("cpu gelu_backward_impl: not implemented yet");
}

void CpuBackend::dropout_forward_impl(const Tensor&, float, RngState, const Tensor&) {
  REMAT_THROW("cpu dropout_forward_impl: not implemented yet");
}

void CpuBackend::dropout_backward_impl(const Tensor&, float, RngState, const Tensor&) {
  REMAT_THROW("cpu dropout_backward_impl: not implemented yet");
}

}  // namespace remat
