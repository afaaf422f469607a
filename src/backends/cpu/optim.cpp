// PLACEHOLDER: replaced by the real implementation before this lands.
#include "backends/cpu/cpu_backend.h"
#include "remat/error.h"

namespace remat {

void CpuBackend::sgd_step_impl(const Tensor&, const Tensor&, const Tensor&, const SgdParams&, int64_t) {
  REMAT_THROW("cpu sgd_step_impl: not implemented yet");
}

void CpuBackend::adamw_step_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AdamWParams&, int64_t) {
  REMAT_THROW("cpu adamw_step_impl: not implemented yet");
}

double CpuBackend::global_norm_impl(const std::vector<Tensor>&) {
  REMAT_THROW("cpu global_norm_impl: not implemented yet");
}

}  // namespace remat
