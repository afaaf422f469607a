// PLACEHOLDER: replaced by the real implementation before this lands.
#include "backends/cpu/cpu_backend.h"
#include "remat/error.h"

namespace remat {

size_t CpuBackend::attention_forward_workspace_impl(const Shape&, const AttentionParams&) {
  REMAT_THROW("cpu attention_forward_workspace_impl: not implemented yet");
}

void CpuBackend::attention_forward_impl(const Tensor&, const AttentionParams&, RngState, const Tensor&, const Tensor&, const Tensor&) {
  REMAT_THROW("cpu attention_forward_impl: not implemented yet");
}

size_t CpuBackend::attention_backward_workspace_impl(const Shape&, const AttentionParams&) {
  REMAT_THROW("cpu attention_backward_workspace_impl: not implemented yet");
}

void CpuBackend::attention_backward_impl(const Tensor&, const Tensor&, const Tensor&, const AttentionParams&, RngState, const Tensor&, const Tensor&) {
  REMAT_THROW("cpu attention_backward_impl: not implemented yet");
}

void CpuBackend::permute_0213_impl(const Tensor&, const Tensor&) {
  REMAT_THROW("cpu permute_0213_impl: not implemented yet");
}

}  // namespace remat
